"""train.fp8_recipe=delayed: scales from an amax history in the train state
(training/fp8_state.py, models/fp8.py). The history's arithmetic; a fresh history is current
scaling; every kind of layout computes one device's loss, gradients and next history from the
same history (one with a scale too small, so saturation, and one too large); resume is exact."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import helpers_ckpt as H

from parity import (assert_close, assert_close_fp8, batch_for, fp8_cases, reference,
                    tiny_config)
from ptdp_jax.config.load import ConfigError
from ptdp_jax.models import fp8 as F8
from ptdp_jax.models import model as M
from ptdp_jax.parallel.sharding import make_mesh
from ptdp_jax.pipeline.balance import chunk_layers, chunk_placement
from ptdp_jax.training import fp8_state as FS
from ptdp_jax.training import state as S
from ptdp_jax.training import step

DELAYED = {"train.fp8": True, "train.fp8_recipe": "delayed"}


def test_update_keeps_the_largest_exponent_seen_and_drops_the_oldest():
    hist = {"fp8_w": jnp.asarray([[[4.0, 2.0, 1.0], [0.5, 0.0, 0.0]]])}     # (L=1, 2, H=3)
    seen = np.zeros((1, 2, F8.NBINS), np.float32)
    seen[0, 0, [3 - F8.E_MIN, 5 - F8.E_MIN]] = [2.0, 0.25]    # x needed 2^3 and 2^5: 2^5
    new = FS.update(hist, {"fp8_w": jnp.asarray(seen)}, jnp.asarray(True))["fp8_w"]
    np.testing.assert_array_equal(new, [[[32.0, 4.0, 2.0], [0.0, 0.5, 0.0]]])  # dy: none seen
    same = FS.update(hist, {"fp8_w": jnp.asarray(seen)}, jnp.asarray(False))["fp8_w"]
    np.testing.assert_array_equal(same, hist["fp8_w"])          # a non-finite step: unchanged


def test_rows_name_the_largest_scale_and_an_empty_row_means_the_own_scale():
    rows = FS.meta_rows({"fp8_w": jnp.asarray([[[0.25, 2.0], [0.0, 0.0]]])})["fp8_w"][0]
    x = jnp.asarray([3.0, -1000.0])
    own, seen = F8.observed(x, F8.E4M3)
    assert float(own) == float(F8.scale_of(x, F8.E4M3))
    assert float(F8.scale_from_bins(rows[0], own)) == 2.0
    assert float(F8.scale_from_bins(rows[1], own)) == float(F8.scale_of(x, F8.E4M3))
    assert float(seen.sum()) == 1.0 and float(F8.observed(jnp.zeros(2), F8.E4M3)[1].sum()) == 0.0
    assert float(F8.scale_from_bins(rows[0], None)) == 2.0     # steady: no fallback needed


def test_steady_ready_needs_a_scale_that_outlives_one_more_step():
    h = jnp.asarray([[[4.0, 0.0, 0.0], [1.0, 2.0, 0.0]]])          # (L=1, 2, H=3)
    assert bool(FS.steady_ready({"fp8_a": h, "fp8_b": h}))
    late = h.at[0, 1].set(jnp.asarray([0.0, 0.0, 2.0]))          # only in the oldest entry
    assert not bool(FS.steady_ready({"fp8_a": h, "fp8_b": late}))
    assert not bool(FS.steady_ready({"fp8_a": h[..., :1]}))      # a history of one step
    assert not bool(FS.steady_ready({}))


def test_recipe_and_history_are_checked():
    with pytest.raises(ConfigError, match="train.fp8_recipe='later' is not one of"):
        tiny_config("gpt", (1, 1, 1), **{"train.fp8": True, "train.fp8_recipe": "later"})
    with pytest.raises(ConfigError, match="train.fp8_amax_history must be positive, got 0"):
        tiny_config("gpt", (1, 1, 1), **{"train.fp8_amax_history": 0})


def delayed_step(cfg, history, steady=False):
    """(loss, canonical gradients, canonical next history) of one step's gradient path from a
    canonical history (steady: the step compiled for a full history)."""
    tx, _ = S.make_optimizer(cfg)
    state = jax.jit(lambda: S.init_state(cfg, tx))()
    hist = S.stage_layers(cfg, history)
    loss, grads = jax.jit(step.make_grad_fn(cfg, make_mesh(cfg.parallel.mesh_dims), steady))(
        step.with_fp8_rows(state.replace(fp8=hist)), batch_for(cfg), 0)
    grads, seen = step.split_fp8_seen(grads, hist)
    seen = M.to_canonical_layout(seen, chunk_layers(cfg), cfg.parallel.pipe, chunk_placement(cfg))
    return (float(loss), jax.tree.map(np.asarray, S.canonical_params(cfg, grads)),
            jax.tree.map(np.asarray, FS.update(history, seen, True)))


@functools.lru_cache(maxsize=None)
def _reference_history(arch):
    """A history from one device's first step: x's scales a quarter of what x needs (its
    largest values saturate), dy's four times (its smallest lose bits)."""
    cfg = tiny_config(arch, (1, 1, 1), **DELAYED)
    _, _, first = delayed_step(cfg, FS.init_history(cfg))
    return {k: jnp.asarray(h) * jnp.asarray([0.25, 4.0])[:, None] for k, h in first.items()}


def test_a_fresh_history_is_current_scaling():
    cfg = tiny_config("llama", (1, 1, 1), **DELAYED)
    loss, grads, nxt = delayed_step(cfg, FS.init_history(cfg))
    assert_close((loss, grads), reference("llama", (("train.fp8", True),)), rtol=1e-6,
                 atol_frac=1e-6)
    assert all((h[..., 0] > 0).all() and (h[..., 1:] == 0).all() for h in nxt.values())


# context parallelism: a rank's amax of its chunks, maxed over the context ranks
CONTEXT = [("gpt", (1, 1, 1), {"parallel.context": 4}),
           ("llama", (2, 1, 1), {"parallel.context": 2, "parallel.zero": 1})]


@pytest.mark.parametrize("arch,mesh,extra", fp8_cases("llama")[0] + CONTEXT,
                         ids=fp8_cases("llama")[1] + ["context4-gpt", "data2-context2-zero1-llama"])
def test_delayed_parity(arch, mesh, extra):
    history = _reference_history(arch)
    loss0, grads0, next0 = delayed_step(tiny_config(arch, (1, 1, 1), **DELAYED), history)
    loss, grads, nxt = delayed_step(tiny_config(arch, mesh, **DELAYED, **extra), history)
    assert_close_fp8((loss, grads), (loss0, grads0), reference(arch))
    for k in next0:
        np.testing.assert_array_equal(nxt[k], next0[k], err_msg=k)


@pytest.mark.parametrize("arch,mesh,extra", [
    ("llama", (1, 1, 1), {}), ("gpt", (1, 1, 1), {}),
    ("llama", (1, 2, 1), {"parallel.schedule": "zb-phased"}),
    ("gpt", (2, 2, 2), {"parallel.sequence_parallel": True}),
    ("llama", (1, 1, 2), {"parallel.sequence_parallel": True, "tuning.tp_comm_overlap": True})],
    ids=["llama", "gpt", "zb-phased-llama", "2x2x2-sp-gpt", "tensor2-ring-llama"])
def test_the_steady_step_is_the_same_step(arch, mesh, extra):
    """With every row holding a scale, the step compiled without the own-scale fallback gives
    the numbers of the step with it: exactly on an AVX2 CPU; on an AVX-512 one XLA rounds a
    few sums of the other program differently (1 ulp, 2026-12-02), so up to float32
    rounding; the next history exactly."""
    history = _reference_history(arch)
    cfg = tiny_config(arch, mesh, **DELAYED, **extra)
    loss, grads, nxt = delayed_step(cfg, history)
    loss_s, grads_s, nxt_s = delayed_step(cfg, history, steady=True)
    H.same_up_to_rounding(loss_s, loss)
    jax.tree.map(H.same_up_to_rounding, grads_s, grads)
    jax.tree.map(np.testing.assert_array_equal, nxt_s, nxt)


def test_the_loop_switches_to_the_steady_step_without_changing_a_number(tmp_path, data_cache,
                                                                        monkeypatch):
    import helpers_ckpt as H
    from ptdp_jax.run import steps as ST
    from ptdp_jax.run.loop import train
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 6, **DELAYED, "checkpoint.dir": ""})
    log = H.Log()
    steady = train(mesh_shape=(1, 1, 1), overrides=ov, log=log)
    assert any("steps round without waiting" in line for line in log.lines)
    monkeypatch.setattr(ST, "READY", "never")
    log = H.Log()
    first_only = train(mesh_shape=(1, 1, 1), overrides=ov, log=log)
    assert not any("steps round without waiting" in line for line in log.lines)
    assert steady.losses == first_only.losses


def test_delayed_resume_is_bit_identical(tmp_path, data_cache):
    """The history is in the checkpoint: 6 steps in one go == 3, stop, 3 resumed; a checkpoint
    of current scaling resumes under delayed with a fresh history."""
    import helpers_ckpt as H
    from ptdp_jax.run.loop import train
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 6, **DELAYED, "checkpoint.every": 3})
    mesh = (2, 1, 2)
    H.assert_resume_exact(ov, mesh, exact=False)      # the resumed first step: not steady
    import ptdp_jax                      # a checkpoint with a history loads for inference
    tokens = np.zeros((1, 8), np.int32)
    assert np.isfinite(ptdp_jax.load(ov["checkpoint.dir"]).logits(tokens)).all()
    other = {**ov, "checkpoint.dir": str(tmp_path / "ck2"), "train.fp8_recipe": "current"}
    train(mesh_shape=mesh, overrides={**other, "train.stop_at_step": 3}, log=H.Log())
    resumed = train(mesh_shape=mesh, overrides={**other, **DELAYED}, log=H.Log())
    assert resumed.start_step == 3 and np.isfinite(resumed.losses).all()


@pytest.mark.parametrize("arch", ["llama", "gpt"])
def test_a_history_of_the_steps_own_scales_is_current_scaling(arch):
    """Each GEMM's row holds its own operands' scales: a step of one microbatch fed the history
    that this same step (same state, same batch) records rounds every operand as with a fresh
    history, bit for bit (with more microbatches a row holds their largest scale)."""
    cfg = tiny_config(arch, (1, 1, 1), **DELAYED, **{"train.micro_batch_size": 8})
    loss0, grads0, first = delayed_step(cfg, FS.init_history(cfg))
    for steady in (False, True):
        loss, grads, nxt = delayed_step(cfg, first, steady)
        assert loss == loss0
        jax.tree.map(np.testing.assert_array_equal, grads, grads0)
        for k, h in nxt.items():
            np.testing.assert_array_equal(h[..., 0], first[k][..., 0])
