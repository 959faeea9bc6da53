"""Attention in the per-device region (tensor parallelism with data or pipeline parallelism).
With cuDNN's kernel (`layers.keeps_residuals`) the forward region hands its vjp residuals to
the backward region, so the backward runs the attention's backward only, and selective
recomputation keeps them; with XLA's (s^2 residuals) the backward runs the forward again.
On CPU the cuDNN route is taken by patching `keeps_residuals` (XLA's kernel inside it).

Counted in the gradient program by the dot_generals that make or read an (s, s) score
tensor; parity against the one-device model as in tests/test_parity_*.py."""
import jax
import pytest

from jaxprs import equations
from parity import assert_close, batch_for, loss_and_grads, reference, tiny_config
from ptdp_jax.training import state as S
from ptdp_jax.training import step as step
from ptdp_jax.models import layers
from ptdp_jax.parallel.sharding import make_mesh


def _score_dots(cfg):
    mesh = make_mesh(cfg.parallel.mesh_dims)
    tx, _ = S.make_optimizer(cfg)
    params = jax.eval_shape(lambda: S.init_state(cfg, tx)["params"])
    jaxpr = jax.make_jaxpr(step.make_grad_fn(cfg, mesh))(params, batch_for(cfg), 0)
    s = cfg.model.seq_len
    ss = lambda v: tuple(getattr(v.aval, "shape", ())[-2:]) == (s, s)
    dots = [e for e, _ in equations(jaxpr.jaxpr) if e.primitive.name == "dot_general"]
    return (sum(ss(e.outvars[0]) for e in dots),
            sum(any(ss(v) for v in e.invars) for e in dots))


def test_cudnn_route_backward_does_not_run_the_forward_again(monkeypatch):
    """With the residuals handed over, (d, p, 2) holds the same score dots as (d, p, 1) with
    no recomputation, and selective keeps them (same count). XLA's route runs the forward
    again (one more score-reading dot per attention: (2,1,2) 8 : 24 against 8 : 16)."""
    none = {"train.recompute": "none"}
    xla_route = _score_dots(tiny_config("gpt", (2, 1, 2), **none))
    monkeypatch.setattr(layers, "keeps_residuals", lambda impl: True)
    for d, p in ((2, 1), (1, 2)):
        reference_dots = _score_dots(tiny_config("gpt", (d, p, 1), **none))
        assert _score_dots(tiny_config("gpt", (d, p, 2), **none)) == reference_dots, (d, p)
        sel = tiny_config("gpt", (d, p, 2), **{"train.recompute": "selective"})
        assert _score_dots(sel) == reference_dots, (d, p)
    assert xla_route[1] > _score_dots(tiny_config("gpt", (2, 1, 2), **none))[1]


@pytest.mark.parametrize("arch,mesh,recompute", [("gpt", (2, 1, 2), "selective"),
                                                 ("gpt", (1, 2, 2), "none"),
                                                 ("llama", (2, 2, 2), "selective")])
def test_cudnn_route_parity(arch, mesh, recompute, monkeypatch):
    monkeypatch.setattr(layers, "keeps_residuals", lambda impl: True)
    cfg = tiny_config(arch, mesh, **{"train.recompute": recompute})
    assert_close(loss_and_grads(cfg), reference(arch))
