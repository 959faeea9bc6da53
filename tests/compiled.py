"""Compile the gradient function of a config without running it (HLO and memory checks)."""
import glob

import jax
import numpy as np

from ptdp_jax.training import state as S
from ptdp_jax.training import step as step
from ptdp_jax.parallel.sharding import make_mesh


def _lowered(cfg, wrap=lambda f: f, trace_only=False):
    """The gradient function lowered for this backend (or only traced, to lower it for
    another platform: `.lower(lowering_platforms=("cuda",))`)."""
    mesh = make_mesh(cfg.parallel.mesh_dims)
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    shardings = S.state_shardings(cfg, mesh, tx)["params"]
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          params, shardings)
    batch = jax.ShapeDtypeStruct((cfg.train.global_batch_size, cfg.model.seq_len + 1), np.int32)
    traced = jax.jit(wrap(step.make_grad_fn(cfg, mesh))).trace(params, batch, 0)
    return traced if trace_only else traced.lower()


def compile_grad_fn(cfg):
    return _lowered(cfg).compile()


def partitioned_hlo(cfg, dump_dir) -> str:
    """The gradient function's HLO right after SPMD partitioning: the collectives as the
    partitioner made them, before any backend pass (XLA dumps it into dump_dir).

    XLA dumps only when it compiles, so the program must not come from the persistent
    compilation cache that other tests turn on (helpers_ckpt.py): it gets a name of its own
    (`partitioned`) and is never written to the cache."""
    def wrap(grad_fn):
        def partitioned(params, batch, step_):
            return grad_fn(params, batch, step_)
        return partitioned
    key = "jax_persistent_cache_min_compile_time_secs"
    before = getattr(jax.config, key)
    jax.config.update(key, 1e9)
    try:
        _lowered(cfg, wrap).compile(compiler_options={
            "xla_dump_to": str(dump_dir), "xla_dump_hlo_pass_re": "spmd-partitioning"})
    finally:
        jax.config.update(key, before)
    (path,) = glob.glob(f"{dump_dir}/*partitioned*after_spmd-partitioning*.txt")
    with open(path) as f:
        return f.read()
