"""Compile the gradient function of a config without running it (HLO and memory checks)."""
import glob

import jax
import numpy as np

from ptdp_jax import state as S
from ptdp_jax import step
from ptdp_jax.sharding import make_mesh


def _lowered(cfg):
    mesh = make_mesh(cfg.parallel.mesh_shape)
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    shardings = S.state_shardings(cfg, mesh, tx)["params"]
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          params, shardings)
    batch = jax.ShapeDtypeStruct((cfg.train.global_batch_size, cfg.model.seq_len + 1), np.int32)
    return jax.jit(step.make_grad_fn(cfg, mesh)).lower(params, batch, 0)


def compile_grad_fn(cfg):
    return _lowered(cfg).compile()


def partitioned_hlo(cfg, dump_dir) -> str:
    """The gradient function's HLO right after SPMD partitioning: the collectives as the
    partitioner made them, before any backend pass (XLA dumps it into dump_dir)."""
    _lowered(cfg).compile(compiler_options={"xla_dump_to": str(dump_dir),
                                            "xla_dump_hlo_pass_re": "spmd-partitioning"})
    (path,) = glob.glob(f"{dump_dir}/*grad_fn*after_spmd-partitioning*.txt")
    with open(path) as f:
        return f.read()
