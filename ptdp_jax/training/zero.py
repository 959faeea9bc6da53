"""ZeRO (parallel.zero): the train state split over the replicas of the weights, 'data' x
'context' (sharding.ZERO_AXES; "over 'data'" below means over both), inside the train step's
shard_map.

The state's layout comes from the rule table (`sharding.zero_axes`: one dim of each parameter,
and of its AdamW moments, named 'zero' -> ZERO_AXES), so each replica holds 1/(d c) of the float32
master weights and moments and the optimizer update (outside the shard_map, element-wise) runs
on that shard. Inside the shard_map the step turns shards into weights and gradients into
shards:

    zero=1  (Megatron's distributed optimizer) the weights are all-gathered once per step, in
            the compute dtype; the gradients of all microbatches but the last accumulate
            locally (float32, full size) and the last microbatch's backward adds them and
            reduce-scatters, per layer inside the backward layer scan (`weight(..., full, acc)`).
    zero=2  (ZeRO-2) the weights are all-gathered once per step, as zero=1, but each
            microbatch's backward reduce-scatters its gradients per layer into float32
            accumulators of the shard's size: no full-size gradient outlives a layer, and the
            weights are not gathered again per microbatch as with zero=3. With the layers
            unrolled (the default) each layer's weights are gathered on their own, so that the
            gathers of later layers may run under the first microbatch's forward.
    zero=3  (ZeRO-3, FSDP) the weights are gathered layer by layer inside the layer scan (or,
            with tuning.scan_layers=false, by each unrolled layer) and
            gathered again in the backward (never saved), each microbatch's backward
            reduce-scatters its gradients per layer: no full-size weight or gradient outlives a
            layer (embedding and head: gathered per microbatch).
    p > 1   all: the stage's weights are gathered once per step at the shard_map boundary (the
            executor's branches take them as loop constants) and the accumulated gradients
            reduce-scattered after the last tick.

Reductions run in parallel.grad_reduce_dtype (float32 by default, as Megatron) and give
float32 gradients. A tensor with no dim that d divides stays replicated over 'data'
(`Layout.data_dim` None): its gradient is all-reduced after the microbatches, as with zero=0.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptdp_jax.config import decisions as D
from ptdp_jax.models import fp8 as F8
from ptdp_jax.models.dense import MasterGrad
from ptdp_jax.training import fp8_state as FS
from ptdp_jax.training import grads as G
from ptdp_jax.models import model as M
from ptdp_jax.parallel.sharding import ZERO_AXES, Sharder, data_axis, vary

F32 = jnp.float32


@dataclass(frozen=True)
class Layout:
    """A parameter's layout: its logical names (the rule table maps them) and its ZeRO dim
    (split over 'data'; None: replicated), both counted from the last dim, so that they fit a
    layer's weight, the (L, ...) stack and the stage layout (S, V, L, ...) alike. The gathers
    and reduce-scatters over 'data' run on each device's block (`Sharder.per_device`, manual
    over 'tensor' too): where 'tensor' was left to GSPMD, its partitioner gathered the operand
    of every collective over 'data' whole over 'tensor' first, so with tensor > 1 the layers
    ran on whole weights ((2,1,2) zero 2, 1.3B: 0.1883 s and 32.8 GiB against zero 0's 0.1707 s
    and 24.4 GiB, 4x H200, 2026-11-27)."""
    sh: Sharder
    names: tuple
    data_dim: int | None                 # negative: from the last dim

    def local(self, fn, x):
        names = self.names[len(self.names) - x.ndim:]
        return self.sh.per_device(fn, names, names)(x)


def layouts(cfg, sh, specs):
    """{group: {name: Layout}} from the stage layout's logical names
    (models.model.param_logical_axes) and the state's PartitionSpecs (ZeRO dims)."""
    def one(names, spec):
        dim = data_axis(spec)
        return Layout(sh, tuple(names), None if dim is None else dim - len(names))
    axes = M.param_logical_axes(cfg.model, True)
    axes["layers"].update({k: n for k, n in FS.logical_axes(cfg).items() if k in specs["layers"]})
    return map2(one, axes, specs)


def gather(x, dtype, lay):
    """The full tensor from this replica's shard (split over 'data' on its ZeRO dim), in dtype."""
    x = x.astype(dtype)
    if lay.data_dim is None:
        return x

    def one(b):
        return jax.lax.all_gather(b, ZERO_AXES, axis=b.ndim + lay.data_dim, tiled=True)
    return lay.local(one, x)


def reduce_scatter(g, reduce_dtype, lay):
    """Sum over 'data' of a full-size gradient, keeping this replica's shard (float32)."""
    def scatter(b):
        b = vary(b.astype(reduce_dtype), ZERO_AXES)
        axis = b.ndim + lay.data_dim
        return jax.lax.psum_scatter(b, ZERO_AXES, scatter_dimension=axis,
                                    tiled=True).astype(F32)
    return lay.local(scatter, g)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def weight(dtype, reduce_dtype, lay, shard, full, acc):
    """A weight from its shard, for the forward; its backward hands the shard the gradient
    summed over 'data'. full: the gathered weight, if there is one (zero=1), else it is
    gathered here (zero=3); acc: float32 gradient of earlier microbatches added before the
    reduce-scatter, or None. The output is named M.WEIGHTS, so the layer scan does not save
    it for the backward (models.model.layer_fn). lay: the parameter's Layout."""
    w = gather(shard, dtype, lay) if full is None else full
    return checkpoint_name(w, M.WEIGHTS)


def _weight_fwd(dtype, reduce_dtype, lay, shard, full, acc):
    return weight(dtype, reduce_dtype, lay, shard, full, acc), acc


def _weight_bwd(dtype, reduce_dtype, lay, acc, g):
    g = g.astype(F32) if acc is None else g.astype(F32) + acc
    return reduce_scatter(g, reduce_dtype, lay), None, None


weight.defvjp(_weight_fwd, _weight_bwd)


# ----------------------------------------------------------------------------- p == 1

def map2(f, *trees):
    """f over the leaves of {group: {name: leaf}} trees (leaves may be None or pytrees)."""
    return {g: {k: f(*(t[g][k] for t in trees)) for k in grp} for g, grp in trees[0].items()}


def _layers(tree):
    """Stage layout (1, 1, L, ...) -> (L, ...) for the layer group (p == 1)."""
    return dict(tree, layers=jax.tree.map(lambda x: x[0, 0], tree["layers"]))


def _maker(cfg, lay):
    """make(group, shards, fulls, accs, pres) -> that group's compute-dtype weights (layers:
    one layer's); pres: {name: fp8.Prequantized} of the gathered weights (`_prequantized`),
    which the GEMMs then take, the gathered weight only receiving their gradient."""
    dtype, rd = M.DTYPES[cfg.compute_dtype], M.DTYPES[cfg.parallel.grad_reduce_dtype]

    def make(group, shards, fulls=None, accs=None, pres=None):
        out = {}
        for k, s in shards.items():
            la = lay[group][k]
            if la.data_dim is None:                # replicated over 'data': plain cast
                out[k] = s.astype(dtype)
            else:
                out[k] = weight(dtype, rd, la, s, None if fulls is None else fulls[k],
                                None if accs is None else accs[k])
        return out if pres is None else _with_pres(out, pres)
    return make


def _prequantized(cfg, sh, fulls_layers):
    """fp8: {name: fp8.Prequantized} per layer (a list, or one (L, ...) stack) of the gathered
    GEMM weights, rounded once a step for all microbatches; else None, and with the tensor
    ring (models/tp_overlap.py), which rounds its plain weights itself."""
    if not cfg.train.fp8 or sh.tp_overlap:
        return None
    dense, specs = M.dense_weight_names(cfg.model), M.gemm_specs(cfg.model)

    def one(layer):
        return {k: F8.prequantize(w, specs[k]) for k, w in layer.items()
                if k in dense and w is not None}
    if isinstance(fulls_layers, list):
        return [one(layer) for layer in fulls_layers]
    return jax.vmap(one)(fulls_layers)


def _loss(cfg, sh, make, shards, fulls, accs, tokens_bs1, key_rows, pres=None):
    """Loss sum of one microbatch, the weights made from shards by `make` (layers: one layer
    at a time inside the layer scan, so that the reduce-scatters run in the backward scan);
    make None: `shards` are the compute weights themselves. pres: the layers' prequantized
    GEMM weights (`_prequantized`), or None."""
    mc = cfg.model
    grp = lambda t, g: None if t is None else t[g]
    if make is None:                         # the weights themselves
        e, hd, layers = shards["embed"], shards["head"], shards["layers"]
        if pres is not None:
            layers = _with_pres(layers, pres)
    else:
        e = make("embed", shards["embed"], grp(fulls, "embed"), grp(accs, "embed"))
        hd = make("head", shards["head"], grp(fulls, "head"), grp(accs, "head"))
        layers = (shards["layers"], grp(fulls, "layers"), grp(accs, "layers"), pres)
        if isinstance(shards["layers"], list):      # unrolled: per layer (M.unstack_layers)
            layers = [(s, _layer(grp(fulls, "layers"), i), _layer(grp(accs, "layers"), i),
                       _layer(pres, i)) for i, s in enumerate(shards["layers"])]
    x = M.embed(mc, sh, e, tokens_bs1[:, :-1], key_rows)
    rows = M.layer_rows(sh, tokens_bs1[:, :-1], key_rows, D.document_end(cfg))
    x = M.run_layers(mc, sh, layers, x, cfg.remat, rows,
                     scan=cfg.scan_layers_on,     # auto: zero=3 scans (a layer at a time)
                     weights=None if make is None else (lambda lp: make("layers", *lp)),
                     regather=fulls is None)      # zero 3; zero 1, 2 gathered them before
    return M.head_loss(mc, sh, e, hd, x, tokens_bs1[:, 1:])


def _with_pres(layers, pres):
    """The layers' weights (a list, or one layer or stack) with each prequantized GEMM weight as
    MasterGrad(its Prequantized, the weight), which receives the gradient."""
    def one(lw, p):
        return {k: MasterGrad(p[k], w) if k in p else w for k, w in lw.items()}
    if isinstance(layers, list):
        return [one(lw, p) for lw, p in zip(layers, pres)]
    return one(layers, pres)


def _layer(stack_or_list, i):
    """Layer i of a (L, ...) stack or of a per-layer list; None stays None."""
    if stack_or_list is None:
        return None
    if isinstance(stack_or_list, list):
        return stack_or_list[i]
    return jax.tree.map(lambda a: a[i], stack_or_list)


def microbatch_grads(cfg, sh, params, batch_rs1, keys_r, manual, lay):
    """p == 1 with parallel.zero >= 1, reducing inside the backward: the gradient path of
    ptdp_jax/training/grads.py, whose sharded leaves come back reduce-scattered over 'data' (float32,
    the state's layout); replicated ones are the replica's own sums (the caller all-reduces
    them, as for zero=0).

    params: this replica's state parameters, stage layout, varying over the manual axes;
    lay: per parameter its Layout (`layouts`)."""
    mbs, keys = G.microbatches(batch_rs1, keys_r, cfg.num_microbatches)
    shards = _layers(params)
    # unrolled: gradients taken and summed per layer, stacked once (M.unstack_layers)
    per_layer = M.per_layer if not cfg.scan_layers_on else (lambda t: t)
    if cfg.parallel.zero in (2, 3):
        return _reduce_every_microbatch(cfg, sh, shards, mbs, keys, manual, lay, per_layer)
    return _reduce_last_microbatch(cfg, sh, shards, mbs, keys, manual, lay, per_layer)


def _reduce_every_microbatch(cfg, sh, shards, mbs, keys, manual, lay, per_layer):
    """zero 2 and 3: every microbatch's backward reduce-scatters per layer into shard-sized
    sums; zero=2 gathers the weights once for all of them, zero=3 in each layer's forward
    and backward."""
    make, fl = _maker(cfg, lay), None
    if cfg.parallel.zero == 2:
        unrolled = not cfg.scan_layers_on
        fl = _only(_gather_all(cfg, dict(shards, layers={}) if unrolled else shards, lay), lay)
        if unrolled:
            # each layer's weights gathered on their own, so that (m = 1) the gathers of
            # later layers can run under the forward of earlier ones instead of all before
            # the first (24 ms a step exposed on the 7.5B, 4x H200, 2026-11-27)
            fl["layers"] = _gather_layers(cfg, shards["layers"], lay["layers"])

    pres = None if fl is None else _prequantized(cfg, sh, fl["layers"])

    def one(tokens, key_rows):
        return jax.value_and_grad(
            lambda s: _loss(cfg, sh, make, s, fl, None, tokens, key_rows, pres))(
                per_layer(shards))
    loss, grads = G.accumulate(one, G.f32_zeros((jnp.zeros(()), per_layer(shards)), manual),
                               mbs, keys)
    return loss, _unlayers(M.stack_layers(grads))


def _reduce_last_microbatch(cfg, sh, shards, mbs, keys, manual, lay, per_layer):
    """zero 1: the weights gathered once; microbatches 0 .. m-2 sum full-size gradients
    locally, and the last microbatch's backward adds them and reduce-scatters per layer."""
    fulls = _gather_all(cfg, shards, lay)
    loss, acc = G.f32_zeros((jnp.zeros(()), per_layer(fulls)), manual)
    m = mbs.shape[0]
    pres = _prequantized(cfg, sh, per_layer(fulls)["layers"])
    if m > 1:
        def one(tokens, key_rows):
            return jax.value_and_grad(
                lambda w: _loss(cfg, sh, None, w, None, None, tokens, key_rows, pres))(
                    per_layer(fulls))
        (loss, acc) = G.accumulate(one, (loss, acc),
                                   *jax.tree.map(lambda a: a[:-1], (mbs, keys)))
    make = _maker(cfg, lay)
    last = jax.tree.map(lambda a: a[-1], (mbs, keys))
    fl = _only(fulls, lay)
    ac = _only(acc, lay) if m > 1 else None
    loss_last, g = jax.value_and_grad(
        lambda s: _loss(cfg, sh, make, s, fl, ac, *last, pres=pres))(
            per_layer(shards))
    g, acc = M.stack_layers(g), M.stack_layers(acc)
    # replicated leaves: their local sums (earlier microbatches added here)
    g = map2(lambda x, a, la: x if la.data_dim is not None else x + a, g, acc, lay)
    return loss + loss_last, _unlayers(g)


def _gather_all(cfg, shards, lay):
    """Every weight whole, in the compute dtype, from this replica's shards (p == 1 layout:
    layers (L, ...))."""
    dtype = M.DTYPES[cfg.compute_dtype]
    return map2(lambda x, la: gather(x, dtype, la), shards, lay)


def _gather_layers(cfg, layers, lay):
    """[layer i's weights whole, or None where replicated over 'data'] for i < L, gathered
    one layer at a time from the (L, ...) shards."""
    dtype = M.DTYPES[cfg.compute_dtype]
    n = jax.tree.leaves(layers)[0].shape[0]
    return [{k: None if lay[k].data_dim is None else gather(x[i], dtype, lay[k])
             for k, x in layers.items()} for i in range(n)]


def _only(tree, lay):
    """tree with None where a parameter is replicated over 'data' (no ZeRO dim); 'layers' may
    be per layer (M.per_layer)."""
    if isinstance(tree["layers"], list):
        rest = _only(dict(tree, layers={}), dict(lay, layers={}))
        return dict(rest, layers=[_only({"layers": t}, lay)["layers"] for t in tree["layers"]])
    return map2(lambda x, la: None if la.data_dim is None else x, tree, lay)


def _unlayers(grads):
    return dict(grads, layers=jax.tree.map(lambda x: x[None, None], grads["layers"]))


# ----------------------------------------------------------------------------- p > 1, reduction

def gather_stage(cfg, params, lay):
    """p > 1: the stage's float32 weights from their shards, gathered once per step in the
    compute dtype (the pipeline executor takes float32 masters; their values only receive
    gradients, so the upcast of the compute-dtype copy loses nothing)."""
    dtype = M.DTYPES[cfg.compute_dtype]
    return map2(lambda x, la: gather(x, dtype, la).astype(F32), params, lay)


def reduce_grads(cfg, grads, lay, reduced: bool):
    """Sharded leaves: reduce-scatter over 'data' (unless `reduced` already); replicated
    leaves: cast to the reduce dtype for the caller's all-reduce."""
    rd = M.DTYPES[cfg.parallel.grad_reduce_dtype]
    return map2(
        lambda g, la: g.astype(rd) if la.data_dim is None
        else (g if reduced else reduce_scatter(g, rd, la)), grads, lay)
