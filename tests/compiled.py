"""Compile the gradient function of a config without running it (HLO and memory checks)."""
import jax
import numpy as np

from ptdp_jax import state as S
from ptdp_jax import step
from ptdp_jax.sharding import make_mesh


def compile_grad_fn(cfg):
    mesh = make_mesh(cfg.parallel.mesh_shape)
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    shardings = S.state_shardings(cfg, mesh, tx)["params"]
    params = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          params, shardings)
    batch = jax.ShapeDtypeStruct((cfg.train.global_batch_size, cfg.model.seq_len + 1), np.int32)
    return jax.jit(step.make_grad_fn(cfg, mesh)).lower(params, batch, 0).compile()
