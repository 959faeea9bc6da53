"""Playing a schedule's tick table (`pipeline.schedule.build_schedule`) with per-op costs.

Two ways a program runs the same table:

* lockstep (ptdp_jax's executor): every tick lasts as long as its slowest op, plus what every
  tick pays (the host's gap before the tick's switch, the stage-to-stage permutes). The tick
  cost is `pipeline.balance.predicted_step`'s, played on one representative row per class of
  equal rows (rows with the same op kinds, halves and chunks on the same stages cost the same)
  and weighted by the class's count.
* async (Megatron): each stage runs its ops in the table's order, each as soon as the stage is
  free and its input has arrived; a message costs `send_s` on the critical path and keeps the
  sender busy (Megatron's blocking send/receive pairs).

Big tables are not built: the time is linear in m once the pipeline is full (one more
microbatch, or one more round of p for the interleaved schedule, adds the same ticks), so
above `EXACT_MAX_OPS` ops the time is extrapolated from m1 = 3p and m2 = 4p microbatches
(tests/test_plan.py checks the extrapolation against the whole table).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from ptdp_jax.pipeline.balance import predicted_step
from ptdp_jax.pipeline.schedule import build_schedule

EXACT_MAX_OPS = 30_000


@dataclass(frozen=True)
class _Rows:
    """The part of a Schedule that predicted_step reads."""
    p: int
    v: int
    table: tuple


@lru_cache(maxsize=512)
def _row_classes(name: str, p: int, m: int, v: int, split: bool):
    """((representative row, count), ...) of the table, and its tick count."""
    sched = build_schedule(name, p, m, v, split_backward=split)
    classes: dict[tuple, list] = {}
    for row in sched.table:
        key = tuple(None if op is None else (op.kind, op.half, op.chunk) for op in row)
        if key in classes:
            classes[key][1] += 1
        else:
            classes[key] = [row, 1]
    return tuple((row, n) for row, n in classes.values()), sched.num_ticks


def _extrapolated(f, name: str, p: int, m: int, v: int):
    """f(m) for small tables; linear extrapolation from m1 = 3p, m2 = 4p for big ones."""
    if 3 * m * v * p <= EXACT_MAX_OPS or m <= 4 * p:
        return f(m)
    m1, m2 = 3 * p, 4 * p
    y1, y2 = f(m1), f(m2)
    return tuple(a + (b - a) * (m - m1) / (m2 - m1) for a, b in zip(y1, y2))


def lockstep_seconds(name: str, p: int, m: int, v: int, split: bool, counts: tuple[int, ...],
                     unit_costs: dict, unit_s: float, per_tick_s: float) -> tuple[float, float]:
    """(step seconds, ticks) of the table in lockstep. unit_costs: predicted_step's costs in
    units of unit_s (a layer's forward): {'head', 'embed', 'bwd'}; per_tick_s: paid by every
    tick."""
    def f(mm):
        classes, ticks = _row_classes(name, p, mm, v, split)
        units = sum(n * predicted_step(_Rows(p, v, (row,)), counts, unit_costs)
                    for row, n in classes)
        return units * unit_s + ticks * per_tick_s, float(ticks)
    return _extrapolated(f, name, p, m, v)


@lru_cache(maxsize=256)
def _async_program(name: str, p: int, m: int, v: int):
    """Ops in table order as (stage, kind, chunk, dependency index or -1, cross-stage input,
    sends a message). Kinds: 'F', 'B' (the whole backward; zero-bubble tables: the input
    gradient) and 'W' (zero-bubble tables: the weight gradient, after its B, sends nothing)."""
    sched = build_schedule(name, p, m, v, split_backward=False)
    last = p * v - 1
    index, ops = {}, []
    for row in sched.table:
        for stage, op in enumerate(row):
            if op is None:
                continue
            mb, c = op.microbatch, op.chunk
            if op.kind == "F":
                dep = None if c == 0 else ("F", mb, c - 1)
                sends = c < last and sched.stage_of(c + 1) != stage
            elif op.kind == "B":
                dep = ("F", mb, c) if c == last else ("B", mb, c + 1)
                sends = c > 0 and sched.stage_of(c - 1) != stage
            else:
                dep, sends = ("B", mb, c), False
            dep_i = -1 if dep is None else index[dep]
            cross = dep is not None and ops[dep_i][0] != stage
            index[(op.kind, mb, c)] = len(ops)
            ops.append((stage, op.kind, c, dep_i, cross, sends))
    return tuple(ops)


def async_seconds(name: str, p: int, m: int, v: int, op_s: dict, send_s: float
                  ) -> tuple[float, float]:
    """(step seconds, ops) of the table run asynchronously. op_s[(kind, chunk)]: seconds of the
    forward 'F' or backward 'B' of a chunk (zero-bubble tables: 'B' the input gradient and 'W'
    the weight gradient); send_s: one stage-to-stage message."""
    def f(mm):
        prog = _async_program(name, p, mm, v)
        free = [0.0] * p
        end = [0.0] * len(prog)
        for i, (stage, kind, chunk, dep, cross, sends) in enumerate(prog):
            ready = 0.0 if dep < 0 else end[dep] + (send_s if cross else 0.0)
            start = max(free[stage], ready)
            end[i] = start + op_s[kind, chunk]
            free[stage] = end[i] + (send_s if sends else 0.0)
        return max(free), float(len(prog))
    return _extrapolated(f, name, p, m, v)
