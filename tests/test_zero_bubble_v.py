"""The ZB-V tick table: the V placement, every op once on its owner stage, in dependency order
(the turn's local handoff like a message: produced at tick T, usable from T+1), within 1F1B's
peak activation memory, and a smaller bubble than ZB-H1 and 1F1B; its executor arrays."""
import pytest

from test_schedule import draw
from test_zero_bubble import _positions
from ptdp_jax.pipeline.schedule import (BWD_INPUT, BWD_WEIGHT, FWD, Op, bubble_fraction_theory,
                                        build_schedule, chunk_placement)

CASES = [(p, m) for p in (1, 2, 3, 4, 8) for m in sorted({1, p, 2 * p, 3 * p, 16})]


def test_v_placement():
    s = build_schedule("zb-v", 4, 4, 2)
    assert [s.stage_of(c) for c in range(8)] == [0, 1, 2, 3, 3, 2, 1, 0]
    assert [s.local_of(c) for c in range(8)] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert s.stage_of(s.last_chunk) == s.stage_of(0) == 0
    assert [s.chunk_at(i, j) for i in range(4) for j in range(2)] == [0, 7, 1, 6, 2, 5, 3, 4]
    assert chunk_placement("interleaved", 4, 2) == tuple((c % 4, c // 4) for c in range(8))


@pytest.mark.parametrize("p,m", CASES)
def test_zb_v_table(p, m):
    s = build_schedule("zb-v", p, m, 2)
    pos = _positions(s)
    last = 2 * p - 1
    expected = {Op(k, mb, c, h) for mb in range(m) for c in range(2 * p)
                for k, h in (("F", "full"), ("B", "input"), ("W", "weight"))}
    assert set(pos) == expected
    for op, (t, stage) in pos.items():
        assert stage == s.stage_of(op.chunk) == (op.chunk if op.chunk < p else last - op.chunk)
        mb, c = op.microbatch, op.chunk
        if op.kind == "F":
            pre = None if c == 0 else Op("F", mb, c - 1, "full")
        elif op.kind == "B":
            pre = Op("F", mb, c, "full") if c == last else Op("B", mb, c + 1, "input")
        else:
            pre = Op("B", mb, c, "input")
        if pre is not None:       # messages and the turn's handoff: usable the tick after
            assert pos[pre][0] < t, (op, pre)
            assert abs(pos[pre][1] - stage) <= 1
    # 1F1B's peak activation memory: a ZB-V activation is half a 1F1B stage's, so at most
    # 2p (microbatch, chunk) pairs from F to W against 1F1B's p microbatches
    one_f_one_b = build_schedule("1f1b", p, m)
    peak_1f1b = max(one_f_one_b.max_in_flight(r) for r in range(p))
    assert max(s.max_in_flight(r) for r in range(p)) <= 2 * peak_1f1b <= 2 * p
    assert s.num_stash_slots <= 2 * p
    # The bubble in unit ticks (one F, B or W of one chunk = t_F / 2): the ideal is 6m ticks
    # (2 chunks x F, B, W per microbatch). Once m >= p the table loses exactly p - 1 ticks for
    # p = 2 and 4 (the last microbatch's input gradients down the V have no W left to overlap
    # with on the stages they have left) and at most p + 3 otherwise (lockstep granularity);
    # with m < p the pipeline cannot fill: at most 4 (p - 1). ZB-H1's unit tick is twice as long.
    bubble = s.num_ticks - 6 * m
    assert bubble <= 4 * (p - 1)
    if m >= p:
        assert bubble <= p + 3
        if p in (2, 4):
            assert bubble == p - 1
            assert s.bubble_fraction_exact() == bubble_fraction_theory("zb-v", p, m, 2)
    if p > 1:
        zb_h1 = build_schedule("zb-h1", p, m)
        assert bubble < 2 * (zb_h1.num_ticks - 3 * m) < 2 * (one_f_one_b.num_ticks - 3 * m)
        assert s.bubble_fraction_exact() < zb_h1.bubble_fraction_exact()
        assert s.bubble_fraction_exact() < one_f_one_b.bubble_fraction_exact()
    assert s.bubble_fraction_exact() * 6 * m == bubble
    assert bubble_fraction_theory("zb-v", p, m, 2) * 6 * m == p - 1    # docs/schedules.md


def test_zb_v_executor_arrays():
    p, m = 4, 8
    s = build_schedule("zb-v", p, m, 2)
    arr = s.executor_arrays()
    ops = arr["op"]
    assert (ops == BWD_INPUT).sum() == (ops == BWD_WEIGHT).sum() == (ops == FWD).sum() == 2 * p * m
    pos = _positions(s)
    for op, (t, stage) in pos.items():
        assert arr["vchunk"][t, stage] == s.local_of(op.chunk)
        if op.kind == "W":      # W reads the W-stash slot its own B wrote
            tb = pos[Op("B", op.microbatch, op.chunk, "input")][0]
            assert arr["wstash_slot"][t, stage] == arr["wstash_slot"][tb, stage]
    # every message arrives on exactly one channel, at the tick after it was produced:
    # activations of chunks < p - 1 from above, of chunks >= p - 1 from below (the turn's
    # handoff on stage p - 1 on the same channel); gradients the other way round
    down_f, up_f = arr["fwd_recv_slot"] >= 0, arr["fwd_recv_up_slot"] >= 0
    down_b, up_b = arr["bwd_recv_down_slot"] >= 0, arr["bwd_recv_slot"] >= 0
    assert down_f.sum() == (p - 1) * m and up_f.sum() == p * m
    assert up_b.sum() == (p - 1) * m + m and down_b.sum() == (p - 1) * m
    for op, (t, stage) in pos.items():
        mb, c = op.microbatch, op.chunk
        if op.kind == "F" and c > 0:
            t0 = pos[Op("F", mb, c - 1, "full")][0] + 1
            col = "fwd_recv_slot" if c < p else "fwd_recv_up_slot"
            assert arr[col][t0, stage] == arr["fwd_in_slot"][t, stage] >= 0
        if op.kind == "B" and c < 2 * p - 1:
            t0 = pos[Op("B", mb, c + 1, "input")][0] + 1
            col = "bwd_recv_slot" if c < p else "bwd_recv_down_slot"
            assert arr[col][t0, stage] == arr["bwd_in_slot"][t, stage] >= 0
    # the other schedules never use the ZB-V channels
    for name, v in (("1f1b", 1), ("interleaved", 2), ("zb-h1", 1)):
        a = build_schedule(name, p, m, v).executor_arrays()
        assert (a["fwd_recv_up_slot"] == -1).all() and (a["bwd_recv_down_slot"] == -1).all()
    with pytest.raises(ValueError, match="v=2"):
        build_schedule("zb-v", 4, 8, 1)


def test_cli_draws_zb_v(tmp_path, capsys):
    printed = draw(tmp_path, capsys, "--schedule", "zb-v", "--p", "4", "--m", "8")
    assert "ticks: 51" in printed and "v=2" in printed
    # the docs' p - 1 unit ticks (it printed "theory 0.000000 (0)")
    assert "predicted 0.062500 (1/16), theory 0.062500 (1/16)" in printed


@pytest.mark.parametrize("over,words", [
    ({"parallel.virtual_stages": 1}, ["parallel.schedule=zb-v", "parallel.virtual_stages=2", "got 1"]),
    ({"parallel.virtual_stages": 3}, ["parallel.virtual_stages=2", "got 3"]),
    ({"parallel.pipe": 1}, ["parallel.pipe >= 2", "parallel.pipe=1"]),
    ({"model.num_layers": 6}, ["model.num_layers=6", "2 x 2 = 4"]),
])
def test_zb_v_config_errors_name_key_and_numbers(over, words):
    from ptdp_jax.config.load import ConfigError, load_config
    from ptdp_jax.config.validation import validate
    o = {"model.num_layers": 8, "parallel.pipe": 2, "parallel.schedule": "zb-v",
         "parallel.virtual_stages": 2, "train.global_batch_size": 8, "train.micro_batch_size": 1}
    validate(load_config(overrides=o))
    with pytest.raises(ConfigError) as e:
        validate(load_config(overrides={**o, **over}))
    for w in words:
        assert w in str(e.value), str(e.value)


def _zb_v_cfg(m, **extra):
    from parity import tiny_config
    return tiny_config("gpt", (1, 4, 1), **{
        "parallel.schedule": "zb-v", "parallel.virtual_stages": 2, "train.global_batch_size": m,
        "train.micro_batch_size": 1, "model.seq_len": 64, "model.hidden_size": 64, **extra})


def test_zb_v_two_permutes_per_tick_and_memory_bounded_in_m():
    """The tick loop sends with exactly two non-cyclic collective-permutes (down and up; the
    turn stays on its stage), and compiled temporary memory at m = 4p stays within 1.3x of
    m = p, like 1F1B and ZB-H1."""
    import re

    from compiled import compile_grad_fn
    small = compile_grad_fn(_zb_v_cfg(4))
    hlo = small.as_text()
    pairs = re.findall(r"collective-permute(?:-start)?\(.*?source_target_pairs=\{((?:\{\d+,\d+\},?)*)\}",
                       hlo)
    assert sorted(pairs) == sorted(["{0,1},{1,2},{2,3}", "{1,0},{2,1},{3,2}"]), pairs
    large = compile_grad_fn(_zb_v_cfg(16))
    t_small = small.memory_analysis().temp_size_in_bytes
    t_large = large.memory_analysis().temp_size_in_bytes
    assert t_large <= 1.3 * t_small, (t_small, t_large)


def test_a_table_that_cannot_be_built_is_a_config_error(monkeypatch):
    """The table is built before any compile (schedule.check_table, which resolving a config
    for its devices runs); should the list scheduler ever deadlock, the error names the
    schedule, p and m."""
    from ptdp_jax.config.load import ConfigError, load_config
    from ptdp_jax.pipeline import schedule

    def stuck(p, m):
        raise RuntimeError(f"schedule zb-v p={p} m={m} deadlocks at tick 3")
    monkeypatch.setattr(schedule, "zb_v_table", stuck)
    o = {"model.num_layers": 8, "parallel.pipe": 2, "parallel.schedule": "zb-v",
         "parallel.virtual_stages": 2, "train.global_batch_size": 8, "train.micro_batch_size": 2}
    with pytest.raises(ConfigError) as e:
        schedule.check_table(load_config(overrides=o))
    for w in ("parallel.schedule=zb-v", "parallel.pipe=2", "4 microbatches", "deadlocks"):
        assert w in str(e.value), str(e.value)
