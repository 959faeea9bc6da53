"""The train step: gradients of one global batch, then one AdamW update.

Gradients are computed inside a `jax.shard_map` that is manual over 'data' and
'pipe' ('tensor' stays automatic, so tensor parallelism is GSPMD's work from the
sharding annotations). Each data-parallel replica accumulates float32 gradients
over its microbatches locally; they are all-reduced over 'data' once per step.
With p > 1 the microbatches run through the pipeline executor.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.models import model as M
from ptdp_jax.pipeline.balance import chunk_layers
from ptdp_jax.sharding import Sharder, logical_to_spec, vary

DTYPES = M.DTYPES


def make_optimizer(cfg):
    t = cfg.train
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, t.lr, warmup_steps=min(t.warmup_steps, t.steps),
        decay_steps=max(t.steps, min(t.warmup_steps, t.steps) + 1),
        end_value=t.lr * t.min_lr_ratio)
    shapes = M.param_shapes(cfg.model)
    # Weight decay on matrices only: no decay on biases and norm scales (1-D per layer).
    decay_mask = {g: {k: len(s) - (1 if g == "layers" else 0) >= 2 for k, s in grp.items()}
                  for g, grp in shapes.items()}
    tx = optax.chain(
        optax.clip_by_global_norm(t.grad_clip) if t.grad_clip > 0 else optax.identity(),
        optax.adamw(schedule, b1=t.beta1, b2=t.beta2, weight_decay=t.weight_decay,
                    mask=decay_mask),
    )
    return tx, schedule


def stage_param_specs(cfg):
    """PartitionSpecs (over the whole mesh) of the parameters in stage layout."""
    axes = M.param_logical_axes(cfg.model, stage_layout=True)
    return jax.tree.map(lambda n: logical_to_spec(n), axes, is_leaf=lambda x: isinstance(x, tuple))


def state_shardings(cfg, mesh, tx):
    """NamedShardings for the whole train state (optimizer state mirrors params)."""
    pspecs = stage_param_specs(cfg)
    param_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), pspecs)
    abstract = jax.eval_shape(lambda: init_state(cfg, tx))
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, abstract["opt"], param_sh,
                                   transform_non_params=lambda _: NamedSharding(mesh, P()))
    rep = NamedSharding(mesh, P())
    return {"params": param_sh, "opt": opt_sh, "step": rep, "bad_steps": rep}


def init_state(cfg, tx):
    params = M.init_params(cfg.model, cfg.train.seed)
    params["layers"] = M.to_stage_layout(params["layers"], chunk_layers(cfg), cfg.parallel.pipe)
    return {"params": params, "opt": tx.init(params), "step": jnp.zeros((), jnp.int32),
            "bad_steps": jnp.zeros((), jnp.int32)}


def canonical_params(cfg, params):
    out = dict(params)
    out["layers"] = M.to_canonical_layout(params["layers"], chunk_layers(cfg), cfg.parallel.pipe)
    return out


def row_keys(seed, step, row_ids):
    """One dropout key per sample row: a function of (seed, step, global row)."""
    base = jax.random.fold_in(jax.random.key(seed), step)
    return jax.vmap(lambda r: jax.random.fold_in(base, r))(row_ids)


def _microbatch_grads(cfg, sh, params, batch_rs1, keys_r, manual):
    """p == 1: scan over microbatches, float32 gradient accumulation, no communication."""
    m = cfg.num_microbatches
    dtype = DTYPES[cfg.train.dtype]
    b = batch_rs1.shape[0] // m
    mbs = batch_rs1.reshape((m, b) + batch_rs1.shape[1:])
    keys = None if keys_r is None else keys_r.reshape((m, b) + keys_r.shape[1:])
    params = dict(params, layers=jax.tree.map(lambda x: x[0, 0], params["layers"]))

    def loss_fn(prm, tokens_bs1, key_rows):
        return M.loss_sum(cfg.model, prm, tokens_bs1[:, :-1], tokens_bs1[:, 1:], sh,
                          cfg.train.recompute, dtype, key_rows)

    def body(acc, xs):
        tokens, key_rows = xs
        loss, g = jax.value_and_grad(loss_fn)(params, tokens, key_rows)
        return jax.tree.map(jnp.add, acc, (loss, g)), None

    zero = jax.tree.map(lambda x: vary(jnp.zeros(x.shape, jnp.float32), manual),
                        (jnp.zeros(()), params))
    (loss, grads), _ = jax.lax.scan(body, zero, (mbs, keys))
    grads = dict(grads, layers=jax.tree.map(lambda x: x[None, None], grads["layers"]))
    return loss, grads


def make_grad_fn(cfg, mesh):
    """(params, batch (B, s+1), step) -> (mean loss, mean gradients), jit-able."""
    # Manual over 'data' and 'pipe' ('tensor' stays automatic: GSPMD does tensor parallelism
    # from the annotations); size-1 axes are manual too, so that attention's nested per-device
    # region (layers.causal_attention) only has 'tensor' left, and no reduction runs over a
    # size-1 axis (_psum_over). Without tensor parallelism every axis is manual, so nothing
    # inside is left to GSPMD's partitioner (cuDNN attention's custom partitioner fails inside
    # a partially manual region).
    if mesh.size == 1 or mesh.size == mesh.shape["tensor"]:
        manual = ()                                  # one device, or (1, 1, t): all GSPMD
    elif mesh.shape["tensor"] == 1:
        manual = ("data", "pipe", "tensor")
    else:
        manual = ("data", "pipe")
    sh = Sharder(mesh).inside(manual)
    pspecs = stage_param_specs(cfg)
    manual_specs = jax.tree.map(lambda s: P(*[a if a in manual else None for a in s]), pspecs)
    data_spec = P("data") if "data" in manual else P()
    n_tokens = cfg.train.global_batch_size * cfg.model.seq_len
    use_dropout = cfg.model.dropout > 0

    def local(params, batch, keys):
        keys = _wrap_keys(keys)
        # Gradients w.r.t. a copy marked varying over 'data' (and 'pipe'): no all-reduce per
        # microbatch; the reductions happen once, below.
        params = jax.tree.map(lambda x: vary(x, manual), params)
        if cfg.parallel.pipe == 1:
            loss, grads = _microbatch_grads(cfg, sh, params, batch, keys, manual)
        else:
            from ptdp_jax.pipeline.executor import pipeline_grads
            loss, grads = pipeline_grads(cfg, sh, params, batch, keys)
        # The one data-parallel reduction. Each gradient is summed over the manual axes its
        # parameter is not sharded over: 'data' always; 'pipe' for the embedding and head
        # (GPT's tied embedding gets its first- and last-stage parts added).
        grads = jax.tree.map(lambda g, spec: _psum_over(g, manual, spec), grads, pspecs)
        loss = _psum_over(loss, manual, P())
        return jax.tree.map(lambda x: x / n_tokens, (loss, grads))

    if manual:
        fn = jax.shard_map(local, mesh=mesh,
                           in_specs=(manual_specs, data_spec, data_spec if use_dropout else P()),
                           out_specs=(P(), manual_specs), axis_names=set(manual))
    else:
        fn = local

    def grad_fn(params, batch, step):
        keys = None
        if use_dropout:
            keys = jax.random.key_data(row_keys(cfg.train.seed, step,
                                                jnp.arange(batch.shape[0], dtype=jnp.int32)))
        return fn(params, batch, keys)

    return grad_fn


def _psum_over(x, manual, spec):
    sharded = {a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry)}
    axes = tuple(a for a in manual if a not in sharded)
    return jax.lax.psum(x, axes) if axes else x


def _wrap_keys(keys):
    return None if keys is None else jax.random.wrap_key_data(keys)


def make_train_step(cfg, mesh, tx):
    grad_fn = make_grad_fn(cfg, mesh)

    def step_fn(state, batch):
        loss, grads = grad_fn(state["params"], batch, state["step"])
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        updates, new_opt = tx.update(grads, state["opt"], state["params"])
        new_params = optax.apply_updates(state["params"], updates)
        # A non-finite step leaves parameters and optimizer state unchanged.
        keep = partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
        new_state = {
            "params": keep(new_params, state["params"]),
            "opt": keep(new_opt, state["opt"]),
            "step": state["step"] + 1,
            "bad_steps": jnp.where(finite, 0, state["bad_steps"] + 1),
        }
        return new_state, {"loss": loss, "grad_norm": grad_norm, "finite": finite}

    return step_fn


@dataclass(frozen=True)
class Compiled:
    step: object          # jitted (state, batch) -> (state, metrics)
    eval_loss: object     # jitted (params, batch) -> loss
    init: object          # jitted () -> state
    shardings: dict


def compile_all(cfg, mesh, tx):
    shardings = state_shardings(cfg, mesh, tx)
    batch_sh = NamedSharding(mesh, P("data"))
    step = jax.jit(make_train_step(cfg, mesh, tx), in_shardings=(shardings, batch_sh),
                   out_shardings=(shardings, None), donate_argnums=(0,))
    grad_fn = make_grad_fn(cfg, mesh)
    eval_loss = jax.jit(lambda params, batch: grad_fn(params, batch, 0)[0],
                        in_shardings=(shardings["params"], batch_sh))
    init = jax.jit(lambda: init_state(cfg, tx), out_shardings=shardings)
    return Compiled(step, eval_loss, init, shardings)
