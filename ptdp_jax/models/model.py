"""The model as three pieces the pipeline can place: embed (first stage),
a stack of identical layers applied by a scan (split into chunks over stages),
head + loss (last stage). Parameters are plain dicts:

    {'embed': {...}, 'layers': {name: (L, ...)}, 'head': {...}}

That canonical layout (layers on a leading axis of length L) does not depend on
the mesh or the schedule; `to_stage_layout` turns it into (p, v, Lmax, ...)
with Megatron's chunk placement for pipelined training (any number of layers per chunk).
"""
from __future__ import annotations

import dataclasses
import math
import zlib

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.models import gpt, llama
from ptdp_jax.models.dense import MasterGrad
from ptdp_jax.models.fused_loss import fused_head_grads, fused_head_loss, num_chunks
from ptdp_jax.models.layers import (FFN_ACT, Rows, gather_seq, keys_of, starts_of,
                                    vocab_parallel_cross_entropy)
from ptdp_jax.parallel.sharding import Sharder

ARCHS = {"gpt": gpt, "llama": llama}
DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}     # train.dtype -> compute dtype


def arch(cfg):
    return ARCHS[cfg.arch]


def _specs(cfg):
    return arch(cfg).param_specs(cfg)


def dense_weight_names(cfg) -> tuple[str, ...]:
    """Layer weights the model uses through layers.dense (GEMM weights)."""
    return arch(cfg).DENSE_WEIGHTS


def gemm_specs(cfg) -> dict[str, str]:
    """GEMM weight name -> its layers.dense einsum spec."""
    return arch(cfg).GEMM_SPECS


def param_logical_axes(cfg, stage_layout: bool = False):
    """Pytree of logical-axis tuples matching the parameters."""
    lead = ("stage", "chunk", "layers") if stage_layout else ("layers",)
    s = _specs(cfg)
    return {
        "embed": {k: v[1] for k, v in s["embed"].items()},
        "layers": {k: lead + v[1] for k, v in s["layer"].items()},
        "head": {k: v[1] for k, v in s["head"].items()},
    }


def param_shapes(cfg):
    s = _specs(cfg)
    return {
        "embed": {k: v[0] for k, v in s["embed"].items()},
        "layers": {k: (cfg.num_layers,) + v[0] for k, v in s["layer"].items()},
        "head": {k: v[0] for k, v in s["head"].items()},
    }


def num_params(cfg) -> int:
    return sum(math.prod(shape) for shape in jax.tree.leaves(
        param_shapes(cfg), is_leaf=lambda x: isinstance(x, tuple)))


def init_params(cfg, seed: int):
    """Canonical parameters in float32. Each tensor's key comes from its name,
    so the values do not depend on the mesh (jit with out_shardings to place)."""
    root = jax.random.key(seed)
    std = cfg.init_std
    scaled = std / math.sqrt(2.0 * cfg.num_layers)   # Megatron's output-layer scaling
    shapes, specs = param_shapes(cfg), _specs(cfg)
    out = {}
    for group, spec_group in (("embed", "embed"), ("layers", "layer"), ("head", "head")):
        out[group] = {}
        for name, (_, _, init) in specs[spec_group].items():
            shape = shapes[group][name]
            key = jax.random.fold_in(root, zlib.crc32(f"{group}/{name}".encode()))
            if init == "ones":
                value = jnp.ones(shape, jnp.float32)
            elif init == "zeros":
                value = jnp.zeros(shape, jnp.float32)
            else:
                value = (std if init == "normal" else scaled) * jax.random.normal(key, shape)
            out[group][name] = value
    return out


# ----------------------------------------------------------------------------- pipeline layout

def even_chunk_layers(num_layers: int, p: int, v: int) -> tuple[int, ...]:
    """Layers per model chunk (global chunk order) for an even split."""
    return (num_layers // (p * v),) * (p * v)


def _layer_index(counts, p: int, placement=None):
    """(p, v, Lmax) global layer index of each stage-layout row; -1 for padding rows.
    Global chunk c = j*p + i lives on stage i as virtual chunk j (Megatron's placement; or
    `placement[c]` = (stage, virtual chunk), e.g. ZB-V's V) and holds counts[c] consecutive
    layers (any per-chunk counts)."""
    v, lmax = len(counts) // p, max(counts)
    idx = np.full((p, v, lmax), -1, np.int64)
    start = np.cumsum((0,) + tuple(counts))
    for c, n in enumerate(counts):
        i, j = (c % p, c // p) if placement is None else placement[c]
        idx[i, j, :n] = np.arange(start[c], start[c] + n)
    return idx


def _standard(counts, p: int, placement) -> bool:
    return placement is None or tuple(placement) == tuple(
        (c % p, c // p) for c in range(len(counts)))


def to_stage_layout(layers, counts, p: int, placement=None):
    """(L, ...) -> (p, v, Lmax, ...); counts: layers of each global chunk (sum L); placement:
    (stage, virtual chunk) of each global chunk (None: chunk c on stage c % p).
    Padding rows (a chunk with fewer than Lmax layers) are zeros and never read."""
    if len(set(counts)) == 1 and _standard(counts, p, placement):   # a reshape, no gather
        v = len(counts) // p
        return jax.tree.map(lambda x: jnp.swapaxes(
            x.reshape((v, p, counts[0]) + x.shape[1:]), 0, 1), layers)
    idx = _layer_index(tuple(counts), p, placement)

    def f(x):
        padded = jnp.concatenate([x, jnp.zeros((1,) + x.shape[1:], x.dtype)])
        return padded[np.where(idx >= 0, idx, x.shape[0])]
    return jax.tree.map(f, layers)


def to_canonical_layout(layers, counts, p: int, placement=None):
    """Inverse of to_stage_layout: (p, v, Lmax, ...) -> (L, ...)."""
    if len(set(counts)) == 1 and _standard(counts, p, placement):
        return jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1).reshape((-1,) + x.shape[3:]), layers)
    idx = _layer_index(tuple(counts), p, placement)
    order = np.argsort(np.where(idx >= 0, idx, idx.size).reshape(-1), kind="stable")
    rows = order[: int((idx >= 0).sum())]          # flat (p*v*Lmax) row of each layer, in order
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[3:])[rows], layers)


# ----------------------------------------------------------------------------- forward pieces

# The fused (cuDNN flash) attention's forward, by primitive name: its outputs are the attention
# output and the softmax statistics, (b, s, h) and (b, n, s): as small as one GEMM output, so
# selective recomputation keeps them instead of running the attention forward again in the
# backward (the s^2 scores that Korthikanti et al. recompute never exist in a flash kernel).
FLASH_ATTENTION_FWD = frozenset({"dot_product_attention_fwd_wrapper",
                                 "dot_product_attention_fwd"})


def _save_dense_and_flash(prim, *_, **params) -> bool:
    """Selective recomputation: keep the GEMM outputs (named "dense") and the flash
    attention's outputs (its primitive's, or named "attention" where it runs in a per-device
    region: layers.keeps_residuals); recompute norms, activations, dropout, bias adds."""
    if prim.name == "name":
        return params.get("name") in ("dense", "attention")
    return prim.name in FLASH_ATTENTION_FWD


def _save_dense_flash_and_act(prim, *args, **params) -> bool:
    """Selective recomputation that also keeps the MLP activation's output (GeLU / SwiGLU,
    named FFN_ACT): the backward runs no activation again (tuning.keep_ffn_activation)."""
    if prim.name == "name" and params.get("name") == FFN_ACT:
        return True
    return _save_dense_and_flash(prim, *args, **params)


def _to_host(policy):
    """`policy`, what it keeps moved to the host's pinned memory after the forward and back
    to the device for the backward (train.recompute=offload): device memory of full
    recomputation, the backward's work of selective, and the copies over PCIe."""
    from jax._src.interpreters.partial_eval import Offloadable   # what jax's own offloading
    offload = Offloadable(src="device", dst="pinned_host")       # policies return

    def pol(prim, *args, **params):
        return offload if policy(prim, *args, **params) is True else False
    return pol


REMAT_POLICIES = {
    "selective": _save_dense_and_flash,             # keep GEMM and flash-attention outputs
    "selective+act": _save_dense_flash_and_act,     # ... and the MLP activation's output
    "offload": _to_host(_save_dense_and_flash),     # selective's, in host memory
    "offload+act": _to_host(_save_dense_flash_and_act),
    "full": jax.checkpoint_policies.nothing_saveable,                          # keep layer inputs
}
WEIGHTS = "layer_weights"   # the name of the weights a `layer_fn(weights=...)` hook makes


def _makes_weights(params) -> bool:
    """Whether a primitive is a call (custom_vjp, ...) whose body names its output WEIGHTS."""
    for v in params.values():
        jaxpr = getattr(v, "jaxpr", v)
        for eqn in getattr(jaxpr, "eqns", ()):
            if eqn.primitive.name == "name" and eqn.params.get("name") == WEIGHTS:
                return True
    return False


def _weights_not_saved(policy):
    """`policy`, except that the weights made by a hook are never saved for the backward:
    they are made again there (ZeRO-3: gathered again, so no layer's full weights outlive it)."""
    def pol(prim, *args, **params):
        if prim.name == "name" and params.get("name") == WEIGHTS:
            return False
        if prim.name != "name" and _makes_weights(params):
            return False
        return policy(prim, *args, **params)
    return pol


def cast(tree, dtype):
    """Floating leaves to dtype; dense.MasterGrad pairs (already a compute copy and its float32
    master) as they are."""
    return jax.tree.map(
        lambda x: x if isinstance(x, MasterGrad) else
        x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x,
        tree, is_leaf=lambda x: isinstance(x, MasterGrad))


def embed(cfg, sh, embed_p, tokens_bs, key_rows=None):
    return arch(cfg).embed(embed_p, tokens_bs, cfg, sh, key_rows)


def layer_rows(sh, tokens_bs, key_rows, eos):
    """What the layers take per row for these input tokens: the dropout keys, and with document
    masking (eos: the end-of-document token, else None) where each token's document begins."""
    if eos is None:
        return key_rows
    return Rows(key_rows, (sh or Sharder()).document_starts(tokens_bs, eos))


def layer_fn(cfg, sh, recompute: str = "none", weights=None, regather: bool = True):
    """One layer as f(layer_params, x_bsh, layer_index, key_rows) -> x_bsh: dropout keys
    folded with the (global) layer index, recomputation by the mode's jax.checkpoint policy.
    weights: None, or a function from what the layer scan hands out per layer to the layer's
    weights (the step's ZeRO gather: models name no mesh axes); what it makes is recomputed in
    the backward, not saved (a hook names its weights WEIGHTS, `jax.ad_checkpoint.checkpoint_name`,
    inside any custom_vjp it uses). regather False: the hook only hands out weights made
    before the layers (ZeRO 1 and 2 gather once a step), so without recomputation the layer
    runs without a jax.checkpoint: under one with everything saveable JAX keeps every
    intermediate of the layer for the backward, two more (b, s, f) tensors a layer than plain
    autodiff (1.3B (2,1,1) zero 2 micro 8: 62.4 against zero 0's 50.0 GiB, 2x H200, 2026-11-27)."""
    layer = arch(cfg).layer

    def f(lp, x_bsh, idx, key_rows):
        keys = keys_of(key_rows)
        if keys is not None:
            keys = jax.vmap(lambda k: jax.random.fold_in(k, idx))(keys)
        if weights is not None:
            lp = weights(lp)
        starts = starts_of(key_rows)
        return layer(lp, x_bsh, cfg, sh, keys if starts is None else Rows(keys, starts))

    if weights is not None and (regather or recompute in REMAT_POLICIES):
        f = jax.checkpoint(f, policy=_weights_not_saved(
            REMAT_POLICIES.get(recompute, jax.checkpoint_policies.everything_saveable)))
    elif recompute in REMAT_POLICIES:
        f = jax.checkpoint(f, policy=REMAT_POLICIES[recompute])
    return f


def run_layers(cfg, sh, layers_p, x_bsh, recompute: str = "none", key_rows=None, first_layer=0,
               scan: bool = True, weights=None, regather: bool = True):
    """Apply a stack of layers (leading axis), recomputation through jax.checkpoint
    policies. scan: a `lax.scan` over the layers, so compile time does not grow with depth;
    otherwise the layers unrolled (longer compile, and no stacked residual buffers for the
    backward to be written into and read from). weights: see layer_fn (layers_p is then
    whatever the hook takes, with the layer axis leading; regather: see layer_fn). Unrolled,
    layers_p may also be a list of per-layer pytrees (what the hook takes for each layer)."""
    if scan and sh is not None:
        sh = dataclasses.replace(sh, in_layer_scan=True)
    f = layer_fn(cfg, sh, recompute, weights, regather)
    if not scan:
        per_layer = isinstance(layers_p, list)
        n = len(layers_p) if per_layer else jax.tree.leaves(layers_p)[0].shape[0]
        for i in range(n):
            lp = layers_p[i] if per_layer else jax.tree.map(lambda a: a[i], layers_p)
            x_bsh = f(lp, x_bsh, first_layer + i, key_rows)
        return x_bsh
    n = jax.tree.leaves(layers_p)[0].shape[0]
    idx = first_layer + jnp.arange(n, dtype=jnp.int32)
    x_bsh, _ = jax.lax.scan(lambda x, sc: (f(sc[0], x, sc[1], key_rows), None),
                            x_bsh, (layers_p, idx))
    return x_bsh


def unstack_layers(layers_L):
    """(L, ...) layer stack -> [layer i's pytree for i < L]. Differentiating with respect to
    these slices (taken outside the function differentiated) gives each layer's gradient on its
    own; differentiating through slices of the stack instead sums L zero-padded copies, one
    fusion of L pads that runs at ~1/3 of the memory bandwidth on GPUs.
    Sums of such gradients are kept per layer too and stacked once (`stack_layers`): adding
    each into its slot of a stack (scatter-add) made XLA:GPU copy the stack per layer."""
    n = jax.tree.leaves(layers_L)[0].shape[0]
    return [jax.tree.map(lambda a: a[i], layers_L) for i in range(n)]


def per_layer(tree):
    """{group: ...} with 'layers' (L, ...) as [layer i's pytree] (`unstack_layers`)."""
    return dict(tree, layers=unstack_layers(tree["layers"]))


def stack_layers(tree):
    """The inverse of `per_layer`: one stacking pass (trees whose 'layers' is stacked: as is)."""
    if not isinstance(tree["layers"], list):
        return tree
    return dict(tree, layers=jax.tree.map(lambda *x: jnp.stack(x), *tree["layers"]))


def logits(cfg, sh, embed_p, head_p, x_bsh):
    return arch(cfg).logits(embed_p, head_p, x_bsh, cfg, sh)


def head_loss(cfg, sh, embed_p, head_p, x_bsh, targets_bs, ids_v=None, axis=None):
    """Sum of token cross-entropies (float32), vocab-parallel (see
    layers.vocab_parallel_cross_entropy for a vocabulary also split over `axis`). Without
    `axis`, fused: gradients taken in the forward, chunk by chunk, so no (b, s, V) logits are
    kept for the backward (models/fused_loss.py)."""
    chunk_loss = _chunk_loss(cfg, sh, ids_v, axis)
    if axis is not None:
        return chunk_loss(embed_p, head_p, x_bsh, targets_bs)
    b, s = x_bsh.shape[:2]
    # under sequence parallelism the chunks are cut from the whole sequence (gathered once)
    return fused_head_loss(chunk_loss, embed_p, head_p, gather_seq(sh, x_bsh), targets_bs,
                           num_chunks(b, s, cfg.padded_vocab_size))


def head_grads(cfg, sh, acc, embed_p, head_p, x_bsh, targets_bs):
    """((loss, embed grads, head grads), dx): head_loss's loss and gradients added to acc, its
    float32 sums, chunk by chunk (fused_loss.fused_head_grads), and the gradient of x_bsh.
    embed_p: the part of the embedding the head reads (`head_embed`)."""
    b, s = x_bsh.shape[:2]
    y, pull = jax.vjp(lambda x: gather_seq(sh, x), x_bsh)
    acc, dy = fused_head_grads(_chunk_loss(cfg, sh), acc, embed_p, head_p, y, targets_bs,
                               num_chunks(b, s, cfg.padded_vocab_size))
    return acc, pull(dy)[0]


def head_embed(cfg, embed_p):
    """The embedding parameters the head reads too (GPT's tied wte; none for LLaMA)."""
    return {k: embed_p[k] for k in arch(cfg).HEAD_EMBED}


def _chunk_loss(cfg, sh, ids_v=None, axis=None):
    def chunk_loss(e, h, x, t):
        return vocab_parallel_cross_entropy(logits(cfg, sh, e, h, x), t, cfg.vocab_size, sh,
                                            ids_v, axis)
    return chunk_loss


def loss_sum(cfg, params, tokens_bs, targets_bs, sh: Sharder | None = None, recompute="none",
             dtype=jnp.float32, key_rows=None, scan_layers: bool = True, eos=None):
    """The whole model on one microbatch: sum of token losses (eos: see layer_rows)."""
    sh = sh or Sharder()
    p = cast(params, dtype)
    x = embed(cfg, sh, p["embed"], tokens_bs, key_rows)
    x = run_layers(cfg, sh, p["layers"], x, recompute, layer_rows(sh, tokens_bs, key_rows, eos),
                   scan=scan_layers)
    return head_loss(cfg, sh, p["embed"], p["head"], x, targets_bs)
