"""The train step: gradients of one global batch, then one AdamW update.

Gradients are computed inside a `jax.shard_map` that is manual over 'data' and
'pipe' ('tensor' stays automatic, so tensor parallelism is GSPMD's work from the
sharding annotations). Each data-parallel replica accumulates float32 gradients
over its microbatches locally; they are all-reduced over 'data' once per step
(in parallel.grad_reduce_dtype). With p > 1 the microbatches run through the
pipeline executor. With parallel.zero >= 1 the state is split over 'data' and
gradients are reduce-scattered instead (ptdp_jax/training/zero.py); the AdamW update, outside
the shard_map, then runs on each replica's shard.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import partial

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.training import grads as G
from ptdp_jax.training import local_grads as LG
from ptdp_jax.models import fp8 as F8
from ptdp_jax.models import model as M
from ptdp_jax.models.dense import MasterGrad
from ptdp_jax.training import zero as Z
from ptdp_jax.config.load import ConfigError
from ptdp_jax.config import decisions as D
from ptdp_jax.parallel import context as C
from ptdp_jax.parallel.sharding import (Sharder, manual_axes, manual_spec, psum_over,
                                      tp_overlap_on, vary)
from ptdp_jax.training import fp8_state as FS
from ptdp_jax.training.state import (TrainState, fp8_stage_spec, init_state, stage_state_specs,
                                     state_shardings, zero_stage)


def row_keys(seed, step, row_ids):
    """One dropout key per sample row: a function of (seed, step, global row)."""
    base = jax.random.fold_in(jax.random.key(seed), step)
    return jax.vmap(lambda r: jax.random.fold_in(base, r))(row_ids)


def _microbatch_grads(cfg, sh, params, batch_rs1, keys_r, manual):
    """p == 1: the microbatches' loss and gradients summed in float32, no communication (the
    gradient path of ptdp_jax/training/grads.py)."""
    dtype = M.DTYPES[cfg.compute_dtype]
    params = dict(params, layers=jax.tree.map(lambda x: x[0, 0], params["layers"]))

    # unrolled layers: each layer's gradient taken and summed on its own, stacked once after
    # the loop (M.unstack_layers); the GEMM weights as (compute copy made once a step, float32
    # master) pairs, so that their gradients come out of the GEMM in float32 and the sums
    # take them inside the GEMM (cuBLAS beta = 1), as the pipeline executor's do
    # (tuning.tp_comm_overlap's rings take plain weights); embedding and head: local_grads.py
    plain = cfg.scan_layers_on or sh.tp_overlap
    wrap = (lambda layers: layers) if plain else _master_grads(cfg, params, dtype, sh.fp8)
    loss, grads = LG.microbatch_grads(cfg, sh, params, batch_rs1, keys_r, manual, wrap)
    return loss, dict(grads, layers=jax.tree.map(lambda x: x[None, None], grads["layers"]))


def _master_grads(cfg, params, dtype, fp8: bool):
    """per-layer float32 layer params -> the same with each GEMM weight as
    MasterGrad(compute copy, float32 master); the compute copies are made here, once (fp8:
    rounded to FP8 here, once)."""
    dense, specs = M.dense_weight_names(cfg.model), M.gemm_specs(cfg.model)
    copies = M.cast(M.unstack_layers(params["layers"]), dtype)
    copies = [{k: F8.prequantize(a, specs[k]) if fp8 and k in dense else a for k, a in c.items()}
              for c in copies]
    return lambda layers: [{k: MasterGrad(c[k], v) if k in dense else v for k, v in lp.items()}
                           for c, lp in zip(copies, layers)]


def make_grad_fn(cfg, mesh, steady: bool = False):
    """(params, batch (B, s+1), step) -> (mean loss, mean gradients), jit-able. steady: delayed
    FP8 rows that all hold an exponent (training/fp8_state.steady_ready)."""
    manual = manual_axes(mesh)                       # see sharding.manual_axes
    _check_reduce_dtype(cfg, mesh, manual)
    sh = replace(Sharder.for_config(cfg, mesh).inside(manual), fp8_steady=steady)
    pspecs = stage_state_specs(cfg)      # as the state holds them (ZeRO: split over 'data')
    if FS.delayed(cfg):                  # the GEMMs' FP8 rows beside the layer weights
        pspecs["layers"].update({k: fp8_stage_spec() for k in FS.meta_names(cfg)})
    manual_specs = jax.tree.map(lambda s: manual_spec(s, manual), pspecs)
    data_spec = P("data") if "data" in manual else P()
    n_tokens = cfg.train.global_batch_size * cfg.model.seq_len
    use_dropout = cfg.model.dropout > 0
    zero = zero_stage(cfg)
    lay = Z.layouts(cfg, sh, pspecs)     # per parameter: its logical names and ZeRO dim
    reduce_dtype = M.DTYPES[cfg.parallel.grad_reduce_dtype]
    # ZeRO reduce-scatters inside the last backward (zero.microbatch_grads), or after it as a
    # pipeline does (decisions.overlap_grad_reduce: the step of zero=0 with full weights)
    in_backward = bool(zero) and cfg.overlap_grad_reduce_on
    path = _grad_path(cfg, sh, manual, lay, zero, in_backward)

    def local(params, batch, keys):
        keys = _wrap_keys(keys)
        batch = C.rows_of(batch, cfg.parallel.context)      # a sequence's chunks, as rows
        # Gradients w.r.t. a copy marked varying over 'data' (and 'pipe'): no all-reduce per
        # microbatch; the reductions happen once, below (ZeRO: reduce-scatters, zero.py).
        params = jax.tree.map(lambda x: vary(x, manual), params)
        loss, grads = path(params, batch, keys)
        grads = (Z.reduce_grads(cfg, grads, lay, reduced=in_backward) if zero
                 else jax.tree.map(lambda g: g.astype(reduce_dtype), grads))
        # The one data-parallel reduction. Each gradient is summed over the manual axes its
        # state is not sharded over: 'data' (unless ZeRO reduce-scattered it); 'pipe' for the
        # embedding and head (GPT's tied embedding gets its first- and last-chunk parts added;
        # under zb-v both are on stage 0 and the sum over 'pipe' is the same).
        grads = jax.tree.map(lambda g, spec: psum_over(g, manual, spec).astype(jnp.float32),
                             grads, pspecs)
        loss = psum_over(loss, manual, P())
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


def _grad_path(cfg, sh, manual, lay, zero: int, in_backward: bool) -> G.GradPath:
    """The step's gradient path (ptdp_jax/training/grads.py), chosen once: ZeRO reducing in the
    backward (p == 1), the microbatch loop (p == 1) or the pipeline executor; with ZeRO
    otherwise, the (stage's) weights gathered once a step before it."""
    if in_backward:
        return partial(Z.microbatch_grads, cfg, sh, manual=manual, lay=lay)
    if cfg.parallel.pipe == 1:
        path = partial(_microbatch_grads, cfg, sh, manual=manual)
    else:
        from ptdp_jax.pipeline.executor import pipeline_grads
        path = partial(pipeline_grads, cfg, sh, modes=pipeline_modes(cfg))
    if not zero:
        return path
    return lambda params, batch, keys: path(Z.gather_stage(cfg, params, lay), batch, keys)


def pipeline_modes(cfg):
    """The pipeline executor's modes, resolved from the config (ptdp_jax/config/decisions.py)."""
    from ptdp_jax.pipeline.executor import PipelineModes
    return PipelineModes(static_stash=cfg.static_stash_on, overlap_p2p=D.overlap_p2p(cfg),
                         empty_buffers=D.empty_buffers(cfg))


def _check_reduce_dtype(cfg, mesh, manual):
    """XLA's CPU compiler aborts the process (AllReducePromotion) on a bfloat16 all-reduce
    or reduce-scatter inside a region manual over 'data' but not 'tensor'; refuse it."""
    if (cfg.parallel.grad_reduce_dtype == "bfloat16" and "data" in manual
            and "tensor" not in manual and mesh.devices.flat[0].platform == "cpu"):
        raise ConfigError(
            f"parallel.grad_reduce_dtype=bfloat16 with parallel.tensor={mesh.shape['tensor']} "
            f"> 1 does not compile on CPU devices (XLA's CPU compiler fails on bfloat16 "
            f"reductions inside a partly manual region); use float32 there, or tensor=1")


def _wrap_keys(keys):
    return None if keys is None else jax.random.wrap_key_data(keys)


def make_train_step(cfg, mesh, tx, steady: bool = False):
    grad_fn = make_grad_fn(cfg, mesh, steady)

    def step_fn(state: TrainState, batch):
        loss, grads = grad_fn(with_fp8_rows(state), batch, state.step)
        grads, seen = split_fp8_seen(grads, state.fp8)
        grad_norm = optax.tree.norm(grads)
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new_state = state.apply_gradients(tx, grads, finite, seen)
        metrics = {"loss": loss, "grad_norm": grad_norm, "finite": finite,
                   "bad_steps": new_state.bad_steps}
        if new_state.fp8 is not None:
            metrics[FS.READY_METRIC] = FS.steady_ready(new_state.fp8)
        return new_state, metrics

    return step_fn


def with_fp8_rows(state: TrainState):
    """The parameters the gradient path takes: with delayed FP8 scaling, each GEMM weight's
    rows (`fp8_<w>`, training/fp8_state.py) beside the layer weights."""
    if state.fp8 is None:
        return state.params
    return dict(state.params, layers={**state.params["layers"], **FS.meta_rows(state.fp8)})


def split_fp8_seen(grads, history):
    """(the parameters' gradients, what the FP8 GEMMs saw: the rows' "gradients", or None)."""
    if history is None:
        return grads, None
    layers = dict(grads["layers"])
    seen = {k: layers.pop(k) for k in history}
    return dict(grads, layers=layers), seen


@dataclass(frozen=True)
class Compiled:
    step: object          # jitted (TrainState, batch) -> (TrainState, metrics)
    eval_loss: object     # jitted (params, batch) -> mean token loss: forward only, no dropout
    init: object          # jitted () -> TrainState
    shardings: TrainState  # of NamedShardings
    batch_sharding: object = None
    steady_step: object = None   # delayed FP8 scaling: `step` for a history that is full


def compiler_options(cfg, mesh) -> dict:
    """XLA options of the train step on `mesh` (decisions.xla_options)."""
    return D.xla_options(cfg, mesh.devices.flat[0].platform, tp_overlap_on(cfg, mesh))


def nccl_environment(cfg, mesh, environ) -> dict[str, str]:
    """The NCCL settings the step runs with, as variables not yet in `environ`
    (decisions.nccl_environment)."""
    return D.nccl_environment(cfg, mesh.devices.flat[0].platform, environ)


def compile_all(cfg, mesh, tx):
    """The step, the evaluation and the state's init, compiled for `mesh`. NCCL reads its
    settings when it makes its first communicator (the first step's collectives), so
    nccl_environment's go into the process's environment here, before anything runs."""
    from ptdp_jax.training.evaluate import make_eval_fn
    os.environ.update(nccl_environment(cfg, mesh, os.environ))
    shardings = state_shardings(cfg, mesh, tx)
    batch_sh = NamedSharding(mesh, P("data"))
    steps = [jax.jit(make_train_step(cfg, mesh, tx, steady), in_shardings=(shardings, batch_sh),
                     out_shardings=(shardings, None), donate_argnums=(0,),
                     compiler_options=compiler_options(cfg, mesh) or None)
             for steady in ((False, True) if FS.steady_possible(cfg) else (False,))]
    eval_loss = jax.jit(make_eval_fn(cfg, mesh), in_shardings=(shardings.params, batch_sh))
    init = jax.jit(lambda: init_state(cfg, tx), out_shardings=shardings)
    return Compiled(steps[0], eval_loss, init, shardings, batch_sh,
                    steps[1] if len(steps) > 1 else None)
