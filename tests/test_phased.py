"""1F1B in forward and backward phases (ptdp_jax.pipeline.phased): the tick table's
invariants, its cost whatever the ratio of backward to forward, and its memory bound."""
from __future__ import annotations

from fractions import Fraction

import pytest

from ptdp_jax.pipeline.phased import head_pairs, phased_parts, zb_phased_table
from ptdp_jax.pipeline.schedule import Op, bubble_fraction_theory, build_schedule
from test_schedule import _positions, _simulate_executor, draw

CONFIGS = [(p, m) for p in range(1, 9) for m in sorted({1, max(1, p - 1), p, 2 * p, 3 * p, 32})]


def test_every_op_once_on_its_stage_after_its_inputs():
    for p, m in CONFIGS:
        s = build_schedule("1f1b-phased", p, m)
        pos = _positions(s)
        want = {Op(k, mb, c, "full") for k in "FB" for mb in range(m) for c in range(p)}
        assert set(pos) == want, (p, m)
        for op, (t, st) in pos.items():
            assert st == op.chunk
            mb, c = op.microbatch, op.chunk
            if op.kind == "F":
                pre = None if c == 0 else Op("F", mb, c - 1, "full")
            else:
                pre = Op("F", mb, c, "full") if c == p - 1 else Op("B", mb, c + 1, "full")
            if pre is not None:
                assert pos[pre][0] < t, (p, m, op)


def test_rows_are_warm_up_steady_pairs_and_cool_down():
    """p - 1 forward rows, m (forward, backward) pairs, p - 1 backward rows: no row in which
    every stage idles, and the parts that `phased_parts` names (the executor runs each as a
    loop, the head after the pairs' forward rows only)."""
    for p, m in CONFIGS:
        s = build_schedule("1f1b-phased", p, m)
        assert s.num_ticks == 2 * (m + p - 1), (p, m)
        assert all(any(op is not None for op in row) for row in s.table), (p, m)
        warm, fwd, bwd, cool = phased_parts(p, m)
        assert sorted([*warm, *fwd, *bwd, *cool]) == list(range(s.num_ticks)), (p, m)
        assert len(warm) == len(cool) == p - 1 and len(fwd) == len(bwd) == m, (p, m)
        kinds = lambda rows: {op.kind for t in rows for op in s.table[t] if op is not None}
        assert kinds(warm) <= {"F"} and kinds(fwd) == {"F"}, (p, m)
        assert kinds(bwd) == {"B"} and kinds(cool) <= {"B"}, (p, m)
        assert list(bwd) == [t + 1 for t in fwd], (p, m)
        # the head: a last-stage forward in every steady forward row, and nowhere else
        last_f = [t for t, row in enumerate(s.table) if row[p - 1] is not None
                  and row[p - 1].kind == "F"]
        assert last_f == list(fwd), (p, m)


@pytest.mark.parametrize("t_b", [Fraction(1), Fraction(2), Fraction(14, 5), Fraction(3)])
def test_time_is_the_theory_for_any_backward_cost(t_b):
    """A tick costs one op of its kind: (m + p - 1)(t_f + t_b), the bubble (p - 1)/m, whatever
    t_b / t_f is; the halves-1F1B meets the theory only at t_b = 2 t_f."""
    for p, m in CONFIGS:
        s = build_schedule("1f1b-phased", p, m)
        assert s.predicted_time_exact(1, t_b) == (m + p - 1) * (1 + t_b), (p, m)
        assert s.bubble_fraction_exact(1, t_b) == bubble_fraction_theory("1f1b-phased", p, m)
        assert bubble_fraction_theory("1f1b-phased", p, m) == Fraction(p - 1, m)
    halves = build_schedule("1f1b", 4, 16)
    phased = build_schedule("1f1b-phased", 4, 16)
    assert halves.bubble_fraction(1, 2.8) > phased.bubble_fraction(1, 2.8) == 3 / 16


def test_in_flight_is_the_round_trip_and_independent_of_m():
    for p, m in CONFIGS:
        s = build_schedule("1f1b-phased", p, m)
        assert [s.max_in_flight(r) for r in range(p)] == [min(m, 2 * (p - 1 - r) + 1)
                                                          for r in range(p)], (p, m)
    assert build_schedule("1f1b-phased", 4, 16).num_stash_slots == 7
    assert build_schedule("1f1b-phased", 4, 64).num_stash_slots == 7


def test_executor_arrays_replay():
    for p, m in CONFIGS:
        if p * m <= 256:
            _simulate_executor(build_schedule("1f1b-phased", p, m))


# ----------------------------------------------------------------------------- v > 1

VCONFIGS = [(p, m, v) for p in (2, 3, 4, 8) for v in (2, 3, 4) for m in (p, 2 * p, 4 * p)]


def test_interleaved_every_op_once_on_its_stage_after_its_inputs():
    """v chunks a stage (chunk c on stage c % p): every (microbatch, chunk) runs F and B once,
    on its stage, after its input; a stage runs its forwards and its backwards each in
    Megatron's interleaved order (groups of p microbatches through the chunks in turn)."""
    for p, m, v in VCONFIGS:
        s = build_schedule("1f1b-phased", p, m, v)
        pos, last = _positions(s), p * v - 1
        want = {Op(k, mb, c, "full") for k in "FB" for mb in range(m) for c in range(p * v)}
        assert set(pos) == want, (p, m, v)
        for op, (t, st) in pos.items():
            mb, c = op.microbatch, op.chunk
            assert st == c % p, (p, m, v, op)
            if op.kind == "F":
                pre = None if c == 0 else Op("F", mb, c - 1, "full")
            else:
                pre = Op("F", mb, c, "full") if c == last else Op("B", mb, c + 1, "full")
            if pre is not None:
                assert pos[pre][0] < t, (p, m, v, op)
        for st in range(p):
            for kind in "FB":
                mine = sorted((t, op) for op, (t, r) in pos.items() if r == st and op.kind == kind)
                order = [(op.microbatch, op.chunk // p) for _, op in mine]
                k = range(m * v)
                local = [(i // p) % v if kind == "F" else v - 1 - (i // p) % v for i in k]
                assert order == [((i // (p * v)) * p + i % p, c) for i, c in zip(k, local)]


def test_interleaved_rows_parts_and_heads():
    """v p - 1 warm-up forward rows, m v - (v - 1) p pairs, v p - 1 cool-down backward rows; the
    pairs whose forward row holds a last-chunk forward (the head) come in groups of p: the
    first group, then every v-th (`head_pairs`, which the executor's loops follow)."""
    for p, m, v in VCONFIGS:
        s = build_schedule("1f1b-phased", p, m, v)
        warm, fwd, bwd, cool = phased_parts(p, m, v)
        assert sorted([*warm, *fwd, *bwd, *cool]) == list(range(s.num_ticks)), (p, m, v)
        assert len(warm) == len(cool) == v * p - 1 and len(fwd) == m * v - (v - 1) * p
        kinds = lambda rows: {op.kind for t in rows for op in s.table[t] if op is not None}
        assert kinds(warm) == kinds(fwd) == {"F"} and kinds(bwd) == kinds(cool) == {"B"}
        last = p * v - 1
        heads = [any(op is not None and op.kind == "F" and op.chunk == last
                     for op in s.table[t]) for t in fwd]
        assert heads == head_pairs(p, m, v), (p, m, v)
        assert not any(op is not None and op.kind == "F" and op.chunk == last
                       for t in warm for op in s.table[t])
        assert sum(heads) == m, (p, m, v)


@pytest.mark.parametrize("t_b", [Fraction(1), Fraction(2), Fraction(14, 5)])
def test_interleaved_time_is_the_theory(t_b):
    """A row costs one chunk's op of its kind (1/v of a stage's): (m v + p - 1)(t_f + t_b)/v,
    the bubble (p - 1)/(v m) whatever t_b / t_f is (the paper's interleaved bubble)."""
    for p, m, v in VCONFIGS:
        s = build_schedule("1f1b-phased", p, m, v)
        assert s.predicted_time_exact(1, t_b) == (m * v + p - 1) * (1 + t_b) / v, (p, m, v)
        assert s.bubble_fraction_exact(1, t_b) == Fraction(p - 1, v * m), (p, m, v)
        assert bubble_fraction_theory("1f1b-phased", p, m, v) == Fraction(p - 1, v * m)


def test_interleaved_in_flight_and_replay():
    """Stage r holds at most v p + p - 1 - 2 r chunk activations (independent of m; v = 1:
    the round trip 2 (p - 1 - r) + 1), no more than Megatron's interleaved warm-up allows; the
    control arrays replay."""
    for p, m, v in VCONFIGS:
        s = build_schedule("1f1b-phased", p, m, v)
        assert [s.max_in_flight(r) for r in range(p)] == [
            min(m * v, v * p + p - 1 - 2 * r) for r in range(p)], (p, m, v)
        inter = build_schedule("interleaved", p, m, v, split_backward=False)
        assert max(map(s.max_in_flight, range(p))) <= max(map(inter.max_in_flight, range(p)))
        if p * m * v <= 256:
            _simulate_executor(s)


def test_chunks_per_stage_rules():
    with pytest.raises(ValueError, match="v=1"):
        build_schedule("zb-h1", 4, 8, 2)
    for name in ("1f1b-phased", "zb-phased"):
        with pytest.raises(ValueError, match="m % p == 0"):
            build_schedule(name, 4, 6, 2)
    assert build_schedule("1f1b-phased", 4, 6).num_ticks == 2 * (6 + 3)     # v = 1: any m


def test_cli_draws_it(tmp_path, capsys):
    printed = draw(tmp_path, capsys, "--schedule", "1f1b-phased", "--p", "4", "--m", "8")
    assert "ticks: 22" in printed and "0.375000" in printed
    printed = draw(tmp_path, capsys, "--schedule", "1f1b-phased", "--p", "4", "--m", "8",
                   "--v", "2")
    assert "ticks: 38" in printed and "0.187500" in printed


def test_head_runs_in_the_tick_loop_without_a_conditional():
    """The spread head's collectives sit in the loop body itself (1f1b-phased: after every
    steady forward row), not in a conditional whose predicate goes to the host each tick (1f1b);
    the warm-up and cool-down loops of 1f1b-phased have no head at all."""
    from compiled import compile_grad_fn
    from parity import tiny_config
    from test_hlo import _while_bodies

    def tick_loops(schedule):
        hlo = compile_grad_fn(tiny_config("gpt", (1, 2, 1), **{
            "parallel.schedule": schedule, "train.micro_batch_size": 2})).as_text()
        return [b for b in _while_bodies(hlo).values() if "collective-permute" in b]

    phased, halves = tick_loops("1f1b-phased"), tick_loops("1f1b")
    assert len(halves) == 1 and "all-reduce(" not in halves[0]
    assert halves[0].count(" conditional(") == 2       # the switch and the head's conditional
    heads = [b for b in phased if "all-reduce(" in b]
    assert len(heads) == 1
    assert heads[0].count(" conditional(") == 2        # the forward and the backward switch
    # one permute a row: activations down after the forward row, gradients up after the
    # backward row (1F1B's tick sends both ways)
    assert heads[0].count("collective-permute(") == 2
    assert halves[0].count("collective-permute(") == 2
    # the warm-up and cool-down loops (p = 2: one row each, which XLA may unroll): one switch
    assert all(b.count(" conditional(") == 1 for b in phased if b is not heads[0])


def test_interleaved_runs_three_loops_with_the_head_in_a_conditional():
    """v > 1: the same three loops (warm-up, steady pairs, cool-down), the head in a
    conditional after the steady forward row (only every v-th group of p pairs has one);
    separate loops for the pairs with and without a head triple the compile."""
    from compiled import compile_grad_fn
    from parity import tiny_config
    hlo = compile_grad_fn(tiny_config("gpt", (1, 2, 1), **{
        "parallel.schedule": "1f1b-phased", "parallel.virtual_stages": 2,
        "train.micro_batch_size": 1})).as_text()
    from test_hlo import _while_bodies
    loops = [b for b in _while_bodies(hlo).values() if "collective-permute" in b]
    assert len(loops) == 3
    steady = [b for b in loops if b.count("collective-permute(") == 2]   # down, then up
    assert len(steady) == 1 and steady[0].count(" conditional(") == 3   # F, head, B
    assert not any("all-reduce(" in b for b in loops)      # the head's: inside its branch


# ----------------------------------------------------------------------------- zb-phased

def test_zb_phased_every_op_once_after_its_inputs_w_after_its_b():
    """zb-phased: each (microbatch, stage) runs F and one backward once on its stage; the
    backward is a B (input gradient) followed by exactly one W exactly where j < s (stage s's
    first backwards, in rows where stage 0 idles), a whole backward otherwise; the rows are
    1f1b-phased's with those ops swapped in (so its order, parts and message timing hold)."""
    for p, m in CONFIGS:
        s = build_schedule("zb-phased", p, m)
        plain = build_schedule("1f1b-phased", p, m)
        assert s.num_ticks == plain.num_ticks and s.has_weight_ops == (p > 1), (p, m)
        pos = _positions(s)
        for st in range(p):
            for j in range(m):
                split = j < st
                b = Op("B", j, st, "input" if split else "full")
                assert pos[Op("F", j, st, "full")][1] == pos[b][1] == st, (p, m, j, st)
                assert pos[b][0] == _positions(plain)[Op("B", j, st, "full")][0], (p, m, j, st)
                assert (Op("W", j, st, "weight") in pos) == split, (p, m, j, st)
                if split:
                    assert pos[Op("W", j, st, "weight")][0] > pos[b][0], (p, m, j, st)
                    # W only in rows where another stage runs a backward (which costs as
                    # much or more): W adds no time
                    row = s.table[pos[Op("W", j, st, "weight")][0]]
                    assert any(op is not None and op.kind == "B" for op in row), (p, m, j, st)
        assert len(pos) == 2 * p * m + sum(min(st, m) for st in range(p)), (p, m)
        # the split rows hold no whole backward: they cost a B, not B + W
        for row in s.table:
            halves = {op.half for op in row if op is not None and op.kind == "B"}
            assert halves <= {"input"} or halves <= {"full"}, (p, m, row)


@pytest.mark.parametrize("t_b", [Fraction(1), Fraction(2), Fraction(14, 5), Fraction(3)])
def test_zb_phased_saves_p_minus_1_half_backwards(t_b):
    """The lockstep time is 1f1b-phased's less (p - 1) t_W, with t_B = t_W = t_b / 2: the
    bubble 2(p - 1)/(3m) at t_b = 2 t_f (the theory), at the same activation stash."""
    for p, m in CONFIGS:
        s = build_schedule("zb-phased", p, m)
        want = (m + p - 1) * (1 + t_b) - (p - 1) * t_b / 2
        assert s.predicted_time_exact(1, t_b) == want, (p, m)
        assert s.bubble_fraction_exact(1, 2) == bubble_fraction_theory("zb-phased", p, m), (p, m)
        assert s.num_stash_slots == build_schedule("1f1b-phased", p, m).num_stash_slots, (p, m)
        assert s.num_wstash_slots == max(1, min(p - 1, m)), (p, m)


def test_zb_phased_interleaved():
    """v > 1: each stage's first s backwards (in its interleaved order) are split, their W in
    its last s cool-down rows, every other backward whole; (p - 1) t_W / v less than
    1f1b-phased at the same activation stash; the control arrays replay."""
    for p, m, v in VCONFIGS:
        s, plain = build_schedule("zb-phased", p, m, v), build_schedule("1f1b-phased", p, m, v)
        pos, ppos = _positions(s), _positions(plain)
        for st in range(p):
            mine = sorted((t, op) for op, (t, r) in ppos.items() if r == st and op.kind == "B")
            for k, (t, op) in enumerate(mine):
                split = k < st
                b = Op("B", op.microbatch, op.chunk, "input" if split else "full")
                assert pos[b] == (t, st), (p, m, v, st, k)
                w = Op("W", op.microbatch, op.chunk, "weight")
                assert (w in pos) == split and (not split or pos[w][0] > t), (p, m, v, st, k)
        for row in s.table:
            halves = {op.half for op in row if op is not None and op.kind == "B"}
            assert halves <= {"input"} or halves <= {"full"}, (p, m, v, row)
        assert s.predicted_time_exact(1, 2) == plain.predicted_time_exact(1, 2) - Fraction(
            p - 1, v), (p, m, v)
        assert s.bubble_fraction_exact(1, 2) == bubble_fraction_theory("zb-phased", p, m, v)
        assert s.num_stash_slots == plain.num_stash_slots, (p, m, v)
        if p * m * v <= 256:
            _simulate_executor(s)


def test_zb_phased_replays_and_draws(tmp_path, capsys):
    for p, m in CONFIGS:
        if p * m <= 256:
            _simulate_executor(build_schedule("zb-phased", p, m))
    assert zb_phased_table(1, 3) == build_schedule("1f1b-phased", 1, 3).table
    printed = draw(tmp_path, capsys, "--schedule", "zb-phased", "--p", "4", "--m", "8")
    assert "ticks: 22" in printed and f"{2 * 3 / (3 * 8):.6f}" in printed
