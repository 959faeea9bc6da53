"""Zero-bubble pipeline schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024)
as lockstep tick tables.

A backward is split into B (the input gradient, on the critical path: sent upstream at once)
and W (the weight gradient, which nothing waits for). With F, B and W each costing one unit,
a lockstep table needs no further splitting, and the W ops can fill what would be bubbles.

ZB-H1 keeps 1F1B's peak activation memory: no stage holds more than p microbatches between
their F and their W (1F1B's first stage holds p). Ticks are filled by a list scheduler, per
stage and tick in priority order:

    B  the next backward in microbatch order, once its gradient has arrived (critical path)
    F  the next forward, once its input has arrived, if fewer than p are in flight (F..W)
    W  the oldest weight gradient whose B has run

which gives the paper's ZB-H1 shape (warm-up forwards, then F-B-W rounds, the W ops sliding
into what would be the cool-down bubble). With unit ops the bubble is at most 2 (p - 1) ticks
against 1F1B's 3 (p - 1), and at most p + 2 once m >= p: the paper's
(p - 1)(t_F + t_B - t_W) = p - 1 plus up to three ticks of lockstep granularity
(tests/test_zero_bubble.py). Pure Python, like schedule.py.
"""
from __future__ import annotations

from collections import deque

from ptdp_jax.pipeline.ops import Op


def zb_h1_table(p: int, m: int) -> tuple[tuple[Op | None, ...], ...]:
    """The ZB-H1 tick table (``table[tick][stage]``) for p stages and m microbatches (v = 1)."""
    last = p - 1
    next_f, next_b = [0] * p, [0] * p          # next microbatch to run F / B on each stage
    pending_w = [deque() for _ in range(p)]     # microbatches whose B ran, W not yet
    in_flight = [0] * p                         # F run, W not yet
    done: dict[Op, int] = {}
    table = []

    def ready(op: Op, tick: int) -> bool:
        return done.get(op, tick) < tick

    while any(next_f[r] < m or next_b[r] < m or pending_w[r] for r in range(p)):
        tick = len(table)
        row: list[Op | None] = [None] * p
        for r in range(p):
            mb_b, mb_f = next_b[r], next_f[r]
            after_b = Op("F", mb_b, r, "full") if r == last else Op("B", mb_b, r + 1, "input")
            if mb_b < m and mb_b < mb_f and ready(after_b, tick):
                row[r] = Op("B", mb_b, r, "input")
            elif mb_f < m and in_flight[r] < p and (r == 0 or ready(Op("F", mb_f, r - 1, "full"), tick)):
                row[r] = Op("F", mb_f, r, "full")
            elif pending_w[r] and ready(Op("B", pending_w[r][0], r, "input"), tick):
                row[r] = Op("W", pending_w[r][0], r, "weight")
        if all(op is None for op in row):
            raise RuntimeError(f"schedule zb-h1 p={p} m={m} deadlocks at tick {tick}")
        for r, op in enumerate(row):
            if op is None:
                continue
            done[op] = tick
            if op.kind == "F":
                next_f[r] += 1
                in_flight[r] += 1
            elif op.kind == "B":
                next_b[r] += 1
                pending_w[r].append(op.microbatch)
            else:
                pending_w[r].popleft()
                in_flight[r] -= 1
        table.append(tuple(row))
    return tuple(table)
