"""parallel.stage_layers: validation, the padded stage layout, and the auto balance."""
import jax.numpy as jnp
import numpy as np
import pytest

from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.config.validation import validate
from ptdp_jax.models import model as M
from ptdp_jax.pipeline import balance as B
from ptdp_jax.pipeline.executor import Branch, control_table, schedule_for
from ptdp_jax.pipeline.schedule import FWD, build_schedule


def cfg_with(**o):
    base = {"model.num_layers": 8, "parallel.pipe": 2, "train.global_batch_size": 8,
            "train.micro_batch_size": 1}
    base.update(o)
    return load_config(overrides=base)


@pytest.mark.parametrize("value,words", [
    ((3, 3, 2), ["3 entries", "2 x 1 = 2"]),
    ((8, 0), ["at least one layer"]),
    ((5, 4), ["sums to 9", "model.num_layers=8"]),
    ("balanced", ["'balanced'", "auto"]),
])
def test_bad_stage_layers_name_key_and_numbers(value, words):
    with pytest.raises(ConfigError) as e:
        validate(cfg_with(**{"parallel.stage_layers": value}))
    assert "parallel.stage_layers" in str(e.value)
    for w in words:
        assert w in str(e.value), str(e.value)


def test_stage_layers_lift_divisibility_and_parse_from_strings():
    with pytest.raises(ConfigError, match="not divisible"):
        validate(cfg_with(**{"model.num_layers": 7}))
    cfg = validate(cfg_with(**{"model.num_layers": 7, "parallel.stage_layers": "4,3"}))
    assert cfg.parallel.stage_layers == (4, 3)
    assert validate(cfg_with(**{"parallel.stage_layers": "auto"})).parallel.stage_layers == "auto"


@pytest.mark.parametrize("counts,p", [((2, 3, 1, 2), 4), ((3, 1, 2, 2), 2), ((1, 4, 2, 1, 3, 1), 3),
                                      ((2, 2, 2, 2), 2)])
def test_stage_layout_round_trip_and_placement(counts, p):
    L = sum(counts)
    layers = {"w": jnp.arange(L * 3, dtype=jnp.float32).reshape(L, 3)}
    stage = M.to_stage_layout(layers, counts, p)
    v = len(counts) // p
    assert stage["w"].shape == (p, v, max(counts), 3)
    start = np.cumsum((0,) + counts)
    for c, n in enumerate(counts):        # chunk c: stage c % p, virtual chunk c // p, its layers
        got = np.asarray(stage["w"][c % p, c // p, :n, 0]) / 3
        np.testing.assert_array_equal(got, np.arange(start[c], start[c] + n))
        assert not np.asarray(stage["w"][c % p, c // p, n:]).any()      # padding is zeros
    back = M.to_canonical_layout(stage, counts, p)
    np.testing.assert_array_equal(np.asarray(back["w"]), np.asarray(layers["w"]))


@pytest.mark.parametrize("counts", [(2, 2, 2, 2, 2, 2, 2, 2), (2, 3, 1, 2, 1, 1, 3, 3)])
def test_zb_v_stage_layout_round_trip(counts):
    """ZB-V: chunk c on stage c (virtual chunk 0) for c < p, on stage 2p-1-c (virtual 1) after."""
    p, L = 4, sum(counts)
    placement = build_schedule("zb-v", p, 4, 2).placement
    layers = {"w": jnp.arange(L, dtype=jnp.float32)}
    stage = M.to_stage_layout(layers, counts, p, placement)
    start = np.cumsum((0,) + counts)
    for c, n in enumerate(counts):
        i, j = (c, 0) if c < p else (2 * p - 1 - c, 1)
        np.testing.assert_array_equal(np.asarray(stage["w"][i, j, :n]),
                                      np.arange(start[c], start[c] + n))
    back = M.to_canonical_layout(stage, counts, p, placement)
    np.testing.assert_array_equal(np.asarray(back["w"]), np.asarray(layers["w"]))


def test_auto_balance_is_valid_and_no_worse_than_even():
    # A padded vocabulary (50048) that does not divide over 3 stages keeps the head on the
    # last one: auto moves layers off that stage.
    cfg = load_config("configs/bench-1.3b.yaml", {
        "parallel.pipe": 3, "train.micro_batch_size": 1, "train.global_batch_size": 12,
        "parallel.stage_layers": "auto", "model.vocab_size": 50001})
    counts = B.chunk_layers(cfg)
    assert len(counts) == 3 and sum(counts) == 24 and min(counts) >= 2
    sched = build_schedule("1f1b", 3, 6, 1)
    costs = B.op_costs(cfg)
    assert costs["head"] > 1.0
    assert B.predicted_step(sched, counts, costs) <= B.predicted_step(sched, (8, 8, 8), costs)
    assert counts[-1] < 8, counts


def test_control_table_branches_follow_the_layer_counts():
    cfg = validate(cfg_with(**{"parallel.stage_layers": (5, 3)}))
    branches, ctl = control_table(schedule_for(cfg), B.chunk_layers(cfg))
    fwd = {(br.vchunk, br.n_layers, br.first, br.last) for br in branches if br.op == FWD}
    assert fwd == {(0, 5, True, False), (0, 3, False, True)}
    assert branches[0] == Branch(0)
    # every scheduled op has a branch; the chunk's first global layer goes with it
    assert set(np.unique(ctl["first_layer"][ctl["branch"] > 0])) == {0, 5}
    assert ctl["head_tick"].sum(axis=1).max() in (0, 2)       # the same on every stage
