"""train.keep_ffn_activation: selective recomputation that keeps the MLP activation's output
(GeLU / SwiGLU) instead of running the activation again in the backward."""
from __future__ import annotations

import contextlib
import io

import jax
import jax.numpy as jnp
import pytest

from parity import assert_close, loss_and_grads, reference, tiny_config
from ptdp_jax.config import ConfigError
from ptdp_jax.memory import layer_activation_bytes_per_token
from ptdp_jax.models import model as M
from ptdp_jax.plan import cost as plan_cost
from ptdp_jax.plan.hardware import gpu_kind
from ptdp_jax.sharding import Sharder

KEEP = {"train.recompute": "selective", "train.keep_ffn_activation": True}


@pytest.mark.parametrize("arch,mesh,extra", [
    ("gpt", (1, 1, 1), {}),
    ("llama", (2, 1, 4), {}),
    ("gpt", (2, 4, 1), {"parallel.schedule": "zb-phased", "train.micro_batch_size": 1}),
    ("llama", (1, 2, 2), {"parallel.schedule": "1f1b-phased", "parallel.virtual_stages": 2,
                          "train.micro_batch_size": 1}),
], ids=["gpt-111", "llama-214", "gpt-241-zb-phased", "llama-122-phased-v2"])
def test_parity(arch, mesh, extra):
    assert_close(loss_and_grads(tiny_config(arch, mesh, **KEEP, **extra)), reference(arch))


def _saved(arch: str, keep: bool) -> str:
    cfg = tiny_config(arch, (1, 1, 1), **{"train.recompute": "selective",
                                          "train.keep_ffn_activation": keep})
    mc = cfg.model
    lp = jax.tree.map(lambda a: a[0], M.init_params(mc, 0)["layers"])
    x = jnp.ones((1, mc.seq_len, mc.hidden_size), jnp.float32)
    f = M.layer_fn(mc, Sharder(), cfg.train.remat)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        jax.ad_checkpoint.print_saved_residuals(lambda lp_, x_: f(lp_, x_, 0, None), lp, x)
    return out.getvalue()


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_the_activation_is_saved_only_when_kept(arch):
    assert "ffn_act" in _saved(arch, True) and "ffn_act" not in _saved(arch, False)


def test_needs_selective():
    with pytest.raises(ConfigError, match="train.keep_ffn_activation.*selective.*'full'"):
        tiny_config("gpt", (1, 1, 1), **{"train.recompute": "full",
                                          "train.keep_ffn_activation": True})


def test_memory_and_planner_count_it():
    """The pre-flight counts T f x 2 bytes more a layer; the planner's backward runs no
    activation again (its read and write of T f at memory speed)."""
    sel = tiny_config("gpt", (1, 1, 1), **{"train.recompute": "selective"})
    keep = tiny_config("gpt", (1, 1, 1), **KEEP)
    f = sel.model.ffn
    scale = 4 // 2 if sel.train.dtype == "float32" else 1
    assert layer_activation_bytes_per_token(keep) - layer_activation_bytes_per_token(sel) \
        == pytest.approx(2.0 * f * scale)
    h100 = gpu_kind("h100")
    assert plan_cost.op_costs(keep, h100, 8).layer_bwd < plan_cost.op_costs(sel, h100, 8).layer_bwd
