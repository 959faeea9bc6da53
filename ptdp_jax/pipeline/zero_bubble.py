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

ZB-V has v = 2 chunks per stage placed in a V (``v_placement``): stage i holds global chunks
i and 2p-1-i, so the forward runs down the stages for chunks 0..p-1, turns on the last stage
(chunk p-1 -> p stays on stage p-1: a local handoff, which like a message is produced at tick
T and usable from T+1), and comes back up; the last chunk (head and loss) is on stage 0 with
the embedding. Each op is a unit: F, B and W of one chunk each cost half a 1F1B stage op.
The list scheduler's priority per stage and tick:

    B  a ready input gradient, oldest microbatch first (critical path)
    F  the stage's second (local 1) chunk of the oldest microbatch whose first chunk ran,
       once its input arrived, if fewer than 2p activations are held (F run, W not)
    F  the first (local 0) chunk of the next microbatch, if fewer than 2p - 1 are held (one
       place stays free for a local-1 forward, so that the V's way back is never blocked)
    W  the oldest weight gradient whose B has run

A stage thus holds at most 2p (microbatch, chunk) activations, each half a 1F1B stage's: 1F1B's
peak of p microbatches on its first stage. The paper's ZB-V bubble is 0 with t_F = t_B = t_W
(sail-sg/zero-bubble-pipeline-parallelism); in lockstep the ideal is 6m ticks (2 chunks x
F, B, W per microbatch) and once m >= p the table takes 6m + p - 1 ticks for p = 2 and 4, at
most 6m + p + 3 for p <= 8 (tests/test_zero_bubble_v.py) and 6m + 2 (p - 1) for p <= 16: a
bubble of about (p - 1)/2 t_F against ZB-H1's ~(p - 1) t_F and 1F1B's 3 (p - 1) t_F.
That the list scheduler never deadlocks is checked (p <= 16, m <= 3p + 2 and some larger),
not proven; `validation.py` builds the table before any compile and names p and m if it does.
"""
from __future__ import annotations

from collections import deque
from functools import lru_cache

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


def v_placement(p: int) -> tuple[tuple[int, int], ...]:
    """ZB-V's chunk placement: global chunk c -> (stage, local chunk). Stage i holds chunks
    i (local 0) and 2p-1-i (local 1): the forward goes down the stages and back up."""
    return tuple((c, 0) if c < p else (2 * p - 1 - c, 1) for c in range(2 * p))


@lru_cache(maxsize=32)
def zb_v_table(p: int, m: int) -> tuple[tuple[Op | None, ...], ...]:
    """The ZB-V tick table (``table[tick][stage]``) for p stages, m microbatches, v = 2."""
    last, place = 2 * p - 1, v_placement(p)
    chunks = [(r, last - r) for r in range(p)]  # (local 0, local 1) global chunks of stage r
    next_f0 = [0] * p                           # next microbatch to enter stage r (local chunk 0)
    ready_f1 = [deque() for _ in range(p)]      # microbatches whose local-0 F ran, local-1 F not
    pending_b = [[] for _ in range(p)]          # (mb, chunk) whose F ran, B not
    pending_w = [deque() for _ in range(p)]     # (mb, chunk) whose B ran, W not
    held = [0] * p                              # (mb, chunk) activations held: F run, W not
    done: dict[Op, int] = {}
    table = []
    n_ops = 6 * m * p

    def ready(op: Op | None, tick: int) -> bool:
        return op is None or done.get(op, tick) < tick

    def b_input(mb: int, c: int) -> Op:
        return Op("F", mb, c, "full") if c == last else Op("B", mb, c + 1, "input")

    def f_input(mb: int, c: int) -> Op | None:
        return None if c == 0 else Op("F", mb, c - 1, "full")

    while len(done) < n_ops:
        tick = len(table)
        row: list[Op | None] = [None] * p
        for r in range(p):
            c0, c1 = chunks[r]
            bs = sorted((mb, -c) for mb, c in pending_b[r] if ready(b_input(mb, c), tick))
            if bs:
                row[r] = Op("B", bs[0][0], -bs[0][1], "input")
            elif (ready_f1[r] and held[r] + 1 <= 2 * p
                  and ready(f_input(ready_f1[r][0], c1), tick)):
                row[r] = Op("F", ready_f1[r][0], c1, "full")
            elif (next_f0[r] < m and held[r] + 2 <= 2 * p
                  and ready(f_input(next_f0[r], c0), tick)):
                row[r] = Op("F", next_f0[r], c0, "full")
            elif pending_w[r] and ready(Op("B", *pending_w[r][0], "input"), tick):
                row[r] = Op("W", *pending_w[r][0], "weight")
        if all(op is None for op in row):
            raise RuntimeError(f"schedule zb-v p={p} m={m} deadlocks at tick {tick}")
        for r, op in enumerate(row):
            if op is None:
                continue
            assert place[op.chunk][0] == r
            done[op] = tick
            key = (op.microbatch, op.chunk)
            if op.kind == "F":
                pending_b[r].append(key)
                held[r] += 1
                if place[op.chunk][1] == 0:
                    next_f0[r] += 1
                    ready_f1[r].append(op.microbatch)
                else:
                    ready_f1[r].popleft()
            elif op.kind == "B":
                pending_b[r].remove(key)
                pending_w[r].append(key)
            else:
                pending_w[r].popleft()
                held[r] -= 1
        table.append(tuple(row))
    return tuple(table)
