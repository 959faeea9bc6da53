"""GPT's attention GEMMs: q, k and v come from three GEMMs of their own, so the attention
kernel's operands are whole GEMM outputs (no slices of a fused QKV output in the forward, no
packing of dq, dk, dv and transposing of a fused weight in the backward: 14 ms a GPU of copies
on (1,2,1), 2x H100, 2026-11-26), and XLA's dot merger, which would fuse them back, is
off on GPU."""
import jax
import jax.numpy as jnp

from jaxprs import equations
from parity import tiny_config
from ptdp_jax.models import gpt
from ptdp_jax.models.model import REMAT_POLICIES, init_params
from ptdp_jax.parallel.sharding import Sharder


def _layer_grad_eqns(recompute):
    cfg = tiny_config("gpt", (1, 1, 1))
    m = cfg.model
    lp = jax.tree.map(lambda a: a[0], init_params(m, 0)["layers"])
    x = jnp.ones((2, m.seq_len, m.hidden_size), jnp.float32)
    sh = Sharder(None)

    def loss(lp, x):
        f = lambda lp, x: gpt.layer(lp, x, m, sh)
        if recompute in REMAT_POLICIES:
            f = jax.checkpoint(f, policy=REMAT_POLICIES[recompute])
        return f(lp, x).sum()

    return [e for e, _ in equations(jax.make_jaxpr(jax.grad(loss))(lp, x).jaxpr)], m


def test_qkv_are_three_gemms_with_no_slicing_or_packing():
    for recompute in ("none", "selective"):
        eqns, m = _layer_grad_eqns(recompute)
        names = [e.primitive.name for e in eqns]
        assert "slice" not in names and "concatenate" not in names, recompute
        assert "pad" not in names, recompute            # the transpose of a slice
        n, d, h = m.num_heads, m.head_dim, m.hidden_size
        qkv = [e for e in eqns if e.primitive.name == "dot_general"
               and e.invars[1].aval.shape == (h, n, d)]
        # y @ w for q, k, v, and their input gradients d(q, k, v) @ w^T, each whole
        assert len(qkv) == 6, recompute
        assert sorted(len(e.outvars[0].aval.shape) for e in qkv) == [3] * 3 + [4] * 3
        specs = gpt.param_specs(m)["layer"]
        assert all(f"{c}_w" in specs and f"{c}_b" in specs for c in "qkv")
        assert not any(len(shape) == 4 for shape, _, _ in specs.values())    # no (h, 3, n, d)
