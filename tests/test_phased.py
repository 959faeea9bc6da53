"""1F1B in forward and backward phases (ptdp_jax.pipeline.phased): the tick table's
invariants, its cost whatever the ratio of backward to forward, and its memory bound."""
from __future__ import annotations

from fractions import Fraction

import pytest

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


def test_rows_alternate_forward_and_backward_phases():
    """Row 2k holds forwards only, row 2k + 1 backwards only (the executor runs them as pairs,
    the head after the forward row); a phase with no op stays; 2 (m + p - 1) rows are busy."""
    for p, m in CONFIGS:
        s = build_schedule("1f1b-phased", p, m)
        assert s.num_ticks == 2 * (m + 2 * p - 2), (p, m)
        for t, row in enumerate(s.table):
            assert {op.kind for op in row if op is not None} <= {"FB"[t % 2]}, (p, m, t, row)
        busy = sum(any(op is not None for op in row) for row in s.table)
        assert busy == 2 * (m + p - 1), (p, m)
        # the all-idle phases: the backward ones of warm-up and the forward ones of cool-down
        idle = [t for t, row in enumerate(s.table) if all(op is None for op in row)]
        assert idle == [2 * T + 1 for T in range(min(p - 1, m + 2 * p - 2))
                        if T < p - 1] + [2 * T for T in range(m + p - 1, m + 2 * p - 2)], (p, m)


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


def test_needs_one_chunk_per_stage():
    with pytest.raises(ValueError, match="v=1"):
        build_schedule("1f1b-phased", 4, 8, 2)


def test_cli_draws_it(tmp_path, capsys):
    printed = draw(tmp_path, capsys, "--schedule", "1f1b-phased", "--p", "4", "--m", "8")
    assert "ticks: 28" in printed and "0.375000" in printed


def test_head_runs_in_the_tick_loop_without_a_conditional():
    """The spread head's collectives sit in the loop body itself (1f1b-phased: after every
    forward row), not in a conditional whose predicate goes to the host each tick (1f1b)."""
    from compiled import compile_grad_fn
    from parity import tiny_config
    from test_hlo import _while_bodies

    def tick_body(schedule):
        hlo = compile_grad_fn(tiny_config("gpt", (1, 2, 1), **{
            "parallel.schedule": schedule, "train.micro_batch_size": 2})).as_text()
        bodies = [b for b in _while_bodies(hlo).values() if "collective-permute" in b]
        assert len(bodies) == 1
        return bodies[0]

    phased, halves = tick_body("1f1b-phased"), tick_body("1f1b")
    assert "all-reduce(" in phased and "all-reduce(" not in halves
    assert phased.count(" conditional(") == 2          # the forward and the backward switch
    assert halves.count(" conditional(") == 2          # the switch and the head's conditional
