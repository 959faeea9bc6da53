"""1F1B's memory bound, from the compiled program's temporary memory: at m = 4p
the 1f1b step stays within 1.3x of its m = p value, while GPipe's grows with m."""
import pytest

from compiled import compile_grad_fn
from parity import tiny_config

P = 4


def temp_bytes(schedule, m, **extra):
    cfg = tiny_config("gpt", (1, P, 1), **{
        "parallel.schedule": schedule, "train.global_batch_size": m, "train.micro_batch_size": 1,
        "model.seq_len": 64, "model.hidden_size": 64, **extra})
    assert cfg.num_microbatches == m
    return compile_grad_fn(cfg).memory_analysis().temp_size_in_bytes


@pytest.mark.parametrize("recompute", ["none", "full"])
def test_1f1b_memory_is_bounded_and_gpipe_grows(recompute):
    f1 = {m: temp_bytes("1f1b", m, **{"train.recompute": recompute}) for m in (P, 4 * P)}
    gp = {m: temp_bytes("gpipe", m, **{"train.recompute": recompute}) for m in (P, 4 * P)}
    assert f1[4 * P] <= 1.3 * f1[P], f1
    # GPipe stashes every microbatch: with no recomputation that is all activations
    # (the dominant term); with full recomputation only the layer inputs, (L/p) of
    # (b, s, h) float32 per microbatch, for 3p more microbatches.
    if recompute == "none":
        assert gp[4 * P] >= 2.0 * gp[P], gp
    else:
        layer_inputs = (8 // P) * 1 * 64 * 64 * 4
        assert gp[4 * P] - gp[P] >= 3 * P * layer_inputs, gp
    assert f1[4 * P] < gp[4 * P], (f1, gp)
