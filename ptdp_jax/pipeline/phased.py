"""1F1B in phases (`parallel.schedule=1f1b-phased`): ticks alternate a forward phase, in which
every busy stage runs a forward, and a backward phase, in which every busy stage runs a whole
backward.

Why: in lockstep a tick lasts as long as its slowest op. The halves-1F1B of schedule.py mixes
forwards and backward halves in one tick, which costs nothing only if a backward half costs
exactly a forward; on the 1.3B GPT with selective recomputation a forward takes ~2.9 ms and
a backward half 3.8-4.3 ms (4x H100, 2026-11-26), so every tick pays for its backward half. Here every
op of a tick is of one kind, so a tick costs one op whatever t_b / t_f is, and a step has
2 (m + p - 1) busy ticks instead of 3 (m + p - 1): fewer permutes and lockstep waits.

The table, for macro tick T = 0 .. m + 2p - 3 (stage s, p stages, m microbatches):

    forward phase    stage s runs F(T - s)                  if 0 <= T - s < m
    backward phase   stage s runs B(T - 2(p - 1) + s)        if 0 <= ... < m

A forward sent in one phase is used in the next forward phase; the last stage runs B(i) in
the backward phase right after its F(i) (the loss gradient is made with the forward); a
gradient sent in one backward phase is used in the next. The phases in which every stage idles
(the backward phases of the first p - 1 macro ticks, the forward phases of the last p - 1) are
left out, so the table has three parts, which the executor runs as three loops (picotron's
warm-up / steady / cool-down):

    warm-up    p - 1 forward rows (T = 0 .. p - 2: no last-stage forward yet, so no head)
    steady     m (forward row, backward row) pairs (T = p - 1 .. m + p - 2), the head at its
               static place after each forward row: every one of them holds a last-stage
               forward, and no conditional surrounds it (a conditional holding collectives
               costs a host round trip per tick)
    cool-down  p - 1 backward rows (T = m + p - 1 .. m + 2p - 3)

The round trip of a microbatch takes two ticks per stage, so stage s holds
2 (p - 1 - s) + 1 microbatches in flight (stage 0: 2p - 1, against p for the halves-1F1B):
the price of uniform ticks is activation memory, still independent of m.

Interleaved (v > 1 chunks a stage, chunk c on stage c % p): the same with a stage's k-th
forward and k-th backward in Megatron's interleaved order (`interleaved_order`) in place of
microbatch T - s and its backward, the backward delayed to macro tick k + vp - 1 + (p - 1 - s).
Rows then cost a chunk's op, the bubble is (p - 1)/(v m), and stage s holds at most
vp + p - 1 - 2s chunk activations; the last stage runs the last chunk's forward in one group of
p steady pairs in v (`head_pairs`). m must be a multiple of p.
"""
from __future__ import annotations

from ptdp_jax.pipeline.ops import Op


def interleaved_order(p: int, m: int, v: int, k: int, forward: bool) -> tuple[int, int]:
    """(microbatch, global chunk) of a stage's k-th forward or backward in Megatron's interleaved
    order (also schedule.py's interleaved table): microbatches in groups of p, each group
    through the local chunks in turn (forwards 0 .. v-1, backwards v-1 .. 0). v = 1:
    microbatch k, chunk 0 (the stage adds its index)."""
    local = (k // p) % v
    return (k // (p * v)) * p + k % p, (local if forward else v - 1 - local) * p


def phased_1f1b_table(p: int, m: int, v: int = 1) -> tuple[tuple[Op | None, ...], ...]:
    """The tick table (rows = ticks, columns = stages; None = idle) of 1f1b-phased: stage s
    runs its forward k = T - s in the forward row of macro tick T and its backward
    k = T - D_s in the backward row, D_s = v p - 1 + (p - 1 - s) (v = 1: 2 (p - 1) - s), for
    0 <= k < m v. Rows in which every stage idles are left out: v p - 1 warm-up forward rows,
    m v - (v - 1) p (forward, backward) pairs, v p - 1 cool-down backward rows."""
    rows, n = [], m * v
    for T in range(n + v * p + p - 2):
        fwd, bwd = [], []
        for s in range(p):
            kf, kb = T - s, T - (v * p - 1 + p - 1 - s)
            mb, c = interleaved_order(p, m, v, kf, True)
            fwd.append(Op("F", mb, c + s, "full") if 0 <= kf < n else None)
            mb, c = interleaved_order(p, m, v, kb, False)
            bwd.append(Op("B", mb, c + s, "full") if 0 <= kb < n else None)
        rows += [tuple(row) for row in (fwd, bwd) if any(op is not None for op in row)]
    return tuple(rows)


def phased_parts(p: int, m: int, v: int = 1) -> tuple[range, range, range, range]:
    """Row indices of the table's parts: (warm-up forward rows, the steady pairs' forward rows,
    their backward rows, cool-down backward rows)."""
    w, pairs = v * p - 1, m * v - (v - 1) * p
    n = 2 * w + 2 * pairs
    return (range(0, w), range(w, w + 2 * pairs, 2), range(w + 1, w + 2 * pairs, 2),
            range(w + 2 * pairs, n))


def head_pairs(p: int, m: int, v: int = 1) -> list[bool]:
    """For each steady pair, whether its forward row holds a last-chunk forward (the head):
    every pair at v = 1; at v > 1 the pairs come in groups of p that each run one local
    chunk on the last stage, so groups 0, v, 2v, ... (m / p - 1 of them after the first)."""
    pairs = m * v - (v - 1) * p
    return [(i // p) % v == 0 for i in range(pairs)]


def zb_phased_table(p: int, m: int, v: int = 1) -> tuple[tuple[Op | None, ...], ...]:
    """1F1B in phases with the zero-bubble split where it shortens rows (`zb-phased`).

    In the first p - 1 steady backward rows not every stage is busy yet: stage s runs its
    first backwards there (k = 0 .. s - 1 in its order), while stages below it idle. Those
    backwards run as B (the input gradient only; its GEMM inputs and output gradients go to the
    W stash), so each of these rows costs t_B instead of t_B + t_W. Stage s then idles in the
    last s cool-down rows, where stage 0 still runs whole backwards, and runs their W there for
    nothing (t_W <= t_B + t_W). Saving: (p - 1) t_W a step (of a chunk's op at v > 1), at the
    same activation stash (the W stash holds up to p - 1 sets of GEMM operands on the last
    stage)."""
    rows = [list(row) for row in phased_1f1b_table(p, m, v)]
    _, _, bwd, cool = phased_parts(p, m, v)
    done = [[] for _ in range(p)]        # each stage's backwards so far, in its order
    for t in [*bwd, *cool]:
        for s, op in enumerate(rows[t]):
            if op is not None:
                if len(done[s]) < s:     # partial rows (stage 0 idle): split
                    rows[t][s] = Op("B", op.microbatch, op.chunk, "input")
                done[s].append(op)
    for i, t in enumerate(cool):
        for s in range(p):
            k = i - (len(cool) - s)      # stage s idles in the last s cool-down rows
            if 0 <= k < min(s, m * v):
                assert rows[t][s] is None
                rows[t][s] = Op("W", done[s][k].microbatch, done[s][k].chunk, "weight")
    return tuple(tuple(row) for row in rows)
