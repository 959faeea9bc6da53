"""Attention in the per-device region (tensor parallelism with data or pipeline parallelism):
its backward runs the attention's backward only. The forward region hands its vjp residuals
to the backward region, instead of the backward running the attention forward again, and
selective recomputation keeps them where the kernel is cuDNN's (small residuals).

Counted in the gradient program (XLA's attention, CPU) by the dot_generals that make or read
an (s, s) score tensor."""
import jax

from parity import batch_for, tiny_config
from ptdp_jax import state as S
from ptdp_jax import step
from ptdp_jax.models import layers
from ptdp_jax.sharding import make_mesh


def _score_dots(cfg):
    mesh = make_mesh(cfg.parallel.mesh_shape)
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    jaxpr = jax.make_jaxpr(step.make_grad_fn(cfg, mesh))(params, batch_for(cfg), 0)
    s = cfg.model.seq_len
    ss = lambda v: tuple(getattr(v.aval, "shape", ())[-2:]) == (s, s)
    out, inp = 0, 0

    def walk(jp):
        nonlocal out, inp
        for e in jp.eqns:
            if e.primitive.name == "dot_general":
                out += ss(e.outvars[0])
                inp += any(ss(v) for v in e.invars)
            for v in e.params.values():
                for sub in (v if isinstance(v, (list, tuple)) else (v,)):
                    inner = getattr(sub, "jaxpr", sub)
                    if hasattr(inner, "eqns"):
                        walk(inner)
    walk(jaxpr.jaxpr)
    return out, inp


def test_per_device_attention_backward_does_not_run_the_forward_again(monkeypatch):
    """With the per-device region ((d, p, 2)) the gradient program holds the same score dots
    as without tensor parallelism ((d, p, 1)), in each recompute mode: before, the region's
    backward ran the attention forward again even with no recomputation (+1 input dot per
    attention: (2,1,2) 8 : 24 against 8 : 16)."""
    for d, p in ((2, 1), (1, 2)):
        for mode in ("none", "selective"):
            o = {"train.recompute": mode}
            per_device = _score_dots(tiny_config("gpt", (d, p, 2), **o))
            assert per_device == _score_dots(tiny_config("gpt", (d, p, 1), **o)), (d, p, mode)
    # selective keeps cuDNN's residuals (XLA's, s^2, are recomputed as without the region)
    none = _score_dots(tiny_config("gpt", (2, 1, 2), **{"train.recompute": "none"}))
    sel = tiny_config("gpt", (2, 1, 2), **{"train.recompute": "selective"})
    assert _score_dots(sel)[1] > none[1]
    monkeypatch.setattr(layers, "keeps_residuals", lambda impl: True)   # as for cuDNN's
    assert _score_dots(sel) == none
