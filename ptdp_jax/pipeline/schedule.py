"""Pipeline schedules (GPipe, 1F1B / PipeDream-Flush, interleaved 1F1B) as lockstep tick tables
(1F1B in forward and backward phases: phased.py; zero bubble: zero_bubble.py).

Pure Python + numpy (no jax): the executor turns ``Schedule.executor_arrays()`` into the
per-tick control of a ``lax.scan``.

Vocabulary (Megatron-LM):

* ``p`` pipeline stages (pipeline ranks), ``m`` microbatches, ``v`` virtual stages (model
  chunks per stage). There are ``p * v`` model chunks; global chunk ``c`` lives on stage
  ``c % p`` with local (virtual) index ``c // p``: stage ``i`` holds chunks ``i, i+p, i+2p...``
  (ZB-V: stage ``i`` holds chunks ``i`` and ``2p-1-i``; ``chunk_placement`` and
  ``Schedule.stage_of`` / ``local_of`` give the placement of any schedule).
* Forward of (mb, c) needs forward of (mb, c-1); backward of (mb, c) needs backward of
  (mb, c+1); backward of the last chunk needs its own forward (the loss gradient is computed
  inside the last chunk's forward). Chunk ``c``'s output goes to the stage of chunk ``c+1``.

Lockstep execution: at each tick every stage runs at most one op; then activations move one
stage forward and gradients one stage back. A message produced at tick T is usable from T+1.

With ``t_b = 2 t_f`` a backward is split into two halves of the cost of a forward: ``upper``
(backward through the upper half of the chunk's layers; local only) then ``lower`` (lower half;
sends the gradient upstream). Every op then costs one unit, so lockstep loses nothing against the
asynchronous schedule and the tick count is exactly the theory:
``3 (m + p - 1)`` ticks for GPipe/1F1B and ``3 (m v + p - 1)`` for interleaved.
With ``split_backward=False`` (a chunk with a single layer) a backward is one op costing two
units; ticks mixing forwards and backwards then cost two units although forwards use one, so
the predicted time exceeds the theory.

Each stage has an op order (``_stage_order``); ops are placed As-Soon-As-Possible: at each tick
a stage runs its next op in order if the inputs arrived at an earlier tick, else it idles.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from ptdp_jax.pipeline.ops import (  # noqa: F401  (re-exported: op codes by name)
    _OP_CODE, BWD_FULL, BWD_INPUT, BWD_LOWER, BWD_UPPER, BWD_WEIGHT, FWD, IDLE, Op)
from ptdp_jax.pipeline.phased import interleaved_order, phased_1f1b_table, zb_phased_table
from ptdp_jax.pipeline.slots import allocate
from ptdp_jax.pipeline.zero_bubble import v_placement, zb_h1_table, zb_v_table

SCHEDULES = ("gpipe", "1f1b", "1f1b-phased", "interleaved", "zb-h1", "zb-v", "zb-phased")
PHASED = ("1f1b-phased", "zb-phased")      # run as warm-up / steady pairs / cool-down loops
ZERO_BUBBLE = ("zb-h1", "zb-v", "zb-phased")   # tables with W ops (a W stash from B to W)


def chunk_placement(name: str, p: int, v: int) -> tuple[tuple[int, int], ...]:
    """(stage, local chunk) of each global chunk: ``(c % p, c // p)`` (Megatron's), or for
    ZB-V the V of ``zero_bubble.v_placement``."""
    if name == "zb-v":
        return v_placement(p)
    return tuple((c % p, c // p) for c in range(p * v))


def bubble_fraction_theory(name: str, p: int, m: int, v: int = 1) -> Fraction:
    """The papers' bubble fraction: (p-1)/m, or (p-1)/(v m) for interleaved and 1f1b-phased;
    ZB-H1 (Qi et al.): (p-1)(t_F + t_B - t_W) / (m (t_F + t_B + t_W)) = (p-1)/(3m) with
    t_B = t_W = t_b/2 = t_F; ZB-V: p - 1 unit ticks (one F, B or W of a chunk) of the 6m a
    microbatch-stage's ops take, (p-1)/(6m): the last input gradients down the V have no W left
    to overlap with (docs/schedules.md; the table's exact bubble for p = 2 and 4 with m >= p; the
    paper's 0 assumes they do); zb-phased (phased.py):
    (p-1)(t_F + t_B) / (m (t_F + t_B + t_W)) = 2(p-1)/(3m), the p - 1 partial backward rows
    costing t_B instead of t_B + t_W (over v at v > 1, as 1f1b-phased's)."""
    _validate(name, p, m, v)
    if name == "zb-h1":
        return Fraction(p - 1, 3 * m)
    if name == "zb-phased":
        return Fraction(2 * (p - 1), 3 * m * v)
    if name == "zb-v":
        return Fraction(p - 1, 6 * m)
    return Fraction(p - 1, m * v if name in ("interleaved", "1f1b-phased") else m)


def _validate(name: str, p: int, m: int, v: int) -> None:
    if name not in SCHEDULES:
        raise ValueError(f"unknown schedule {name!r}; expected one of {SCHEDULES}")
    for key, val in (("p", p), ("m", m), ("v", v)):
        if not isinstance(val, (int, np.integer)) or val < 1:
            raise ValueError(f"{key} must be an integer >= 1, got {key}={val!r}")
    if name in ("gpipe", "1f1b", "zb-h1") and v != 1:
        raise ValueError(f"schedule {name!r} needs v=1 (one model chunk per stage), got v={v}")
    if name == "zb-v" and v != 2:
        raise ValueError(f"schedule 'zb-v' needs v=2 (two model chunks per stage, in a V), got v={v}")
    if name == "interleaved" and v < 2:
        raise ValueError(f"interleaved schedule needs v >= 2 model chunks per stage, got v={v}")
    if (name == "interleaved" or v > 1 and name in PHASED) and m % p != 0:
        raise ValueError(f"schedule {name!r} with v={v} needs m % p == 0 (microbatches in "
                         f"groups of p), got m={m}, p={p}")


def _stage_order(name: str, p: int, m: int, v: int, r: int) -> list[tuple[str, int, int]]:
    """Megatron's op order on pipeline rank r as (kind, microbatch, global chunk)."""
    if name == "gpipe":
        return [("F", i, r) for i in range(m)] + [("B", i, r) for i in range(m)]

    if name == "1f1b":
        fwd = [("F", i, r) for i in range(m)]
        bwd = [("B", i, r) for i in range(m)]
        warmup = min(p - r - 1, m)
    else:  # interleaved: Megatron's forward_backward_pipelining_with_interleaving
        total = m * v

        def seq(k: int, forward: bool) -> tuple[str, int, int]:
            mb, c = interleaved_order(p, m, v, k, forward)
            return ("F" if forward else "B", mb, c + r)

        fwd = [seq(k, True) for k in range(total)]
        bwd = [seq(k, False) for k in range(total)]
        warmup = min(2 * (p - r - 1) + (v - 1) * p, total)

    order = fwd[:warmup]
    for i in range(len(fwd) - warmup):      # steady state: one forward, one backward
        order += [fwd[warmup + i], bwd[i]]
    order += bwd[len(fwd) - warmup:]         # cool-down
    return order


def build_schedule(name: str, p: int, m: int, v: int = 1, split_backward: bool = True,
                   chunk_pools: bool = False) -> "Schedule":
    """Build the lockstep tick table of schedule ``name`` by ASAP placement of each stage's order
    (zero-bubble schedules: by the list scheduler of ``zero_bubble.py``). ``chunk_pools``: the
    stash slots in a pool per local chunk (see Schedule.chunk_pools)."""
    _validate(name, p, m, v)
    sched = _table_schedule(name, p, m, v, split_backward)
    return dataclasses.replace(sched, chunk_pools=True) if chunk_pools else sched


def _table_schedule(name: str, p: int, m: int, v: int, split_backward: bool) -> "Schedule":
    if name == "zb-h1":
        return Schedule(name, p, 1, m, True, zb_h1_table(p, m))
    if name == "zb-v":
        return Schedule(name, p, 2, m, True, zb_v_table(p, m))
    if name == "1f1b-phased":      # whole backwards: every op of a tick of one kind (phased.py)
        return Schedule(name, p, v, m, False, phased_1f1b_table(p, m, v))
    if name == "zb-phased":        # the same, the first p - 1 partial rows split into B / W
        return Schedule(name, p, v, m, False, zb_phased_table(p, m, v))
    last = p * v - 1
    halves = ("upper", "lower") if split_backward else ("full",)
    queues = []
    for r in range(p):
        q = []
        for kind, mb, c in _stage_order(name, p, m, v, r):
            q += [Op("F", mb, c, "full")] if kind == "F" else [Op("B", mb, c, h) for h in halves]
        queues.append(q)
    final_half = halves[-1]

    def prerequisite(op: Op) -> Op | None:
        if op.kind == "F":
            return None if op.chunk == 0 else Op("F", op.microbatch, op.chunk - 1, "full")
        if op.half == "lower":
            return Op("B", op.microbatch, op.chunk, "upper")
        if op.chunk == last:
            return Op("F", op.microbatch, op.chunk, "full")
        return Op("B", op.microbatch, op.chunk + 1, final_half)

    done: dict[Op, int] = {}
    pos = [0] * p
    table = []
    while any(pos[r] < len(queues[r]) for r in range(p)):
        tick = len(table)
        row: list[Op | None] = [None] * p
        for r in range(p):
            if pos[r] < len(queues[r]):
                op = queues[r][pos[r]]
                pre = prerequisite(op)
                if pre is None or done.get(pre, tick) < tick:
                    row[r] = op
        if all(o is None for o in row):
            raise RuntimeError(f"schedule {name} p={p} m={m} v={v} deadlocks at tick {tick}")
        for r, op in enumerate(row):
            if op is not None:
                done[op] = tick
                pos[r] += 1
        table.append(tuple(row))
    return Schedule(name, p, v, m, split_backward, tuple(table))


@dataclass(frozen=True)
class Schedule:
    """A lockstep pipeline schedule: ``table[tick][stage]`` is the Op run there, or None (idle)."""
    name: str
    p: int
    v: int
    m: int
    split_backward: bool
    table: tuple[tuple[Op | None, ...], ...]
    # Residual and W stash slots in a pool per local chunk, so that a slot only ever holds one
    # chunk's residuals: with the static stash (a branch per (op, chunk, slot)) that cuts
    # the branches of v > 1 tables (p 4, v 3: 123 -> 56) for a few more slots (15 -> 19).
    chunk_pools: bool = False

    @property
    def num_ticks(self) -> int:
        return len(self.table)

    @property
    def last_chunk(self) -> int:
        return self.p * self.v - 1

    @functools.cached_property
    def placement(self) -> tuple[tuple[int, int], ...]:
        """(stage, local chunk) of each global chunk."""
        return chunk_placement(self.name, self.p, self.v)

    def stage_of(self, chunk: int) -> int:
        return self.placement[chunk][0]

    def local_of(self, chunk: int) -> int:
        return self.placement[chunk][1]

    def chunk_at(self, stage: int, local: int) -> int:
        """The global chunk of local chunk ``local`` on ``stage``."""
        return self.placement.index((stage, local))

    # ---- cost model -------------------------------------------------------------------------
    def op_cost(self, op: Op | None, t_f=1, t_b=2) -> Fraction:
        """F costs t_f/v, a split backward half t_b/(2v) (so do a zero-bubble B and W), an
        unsplit backward t_b/v (exact)."""
        if op is None:
            return Fraction(0)
        if op.kind == "F":
            return Fraction(t_f) / self.v
        return Fraction(t_b) / (self.v * (2 if op.half != "full" else 1))

    def tick_costs(self, t_f=1, t_b=2) -> list[Fraction]:
        """Cost of each tick: the most expensive op run in it (lockstep waits for the slowest)."""
        return [max(self.op_cost(op, t_f, t_b) for op in row) for row in self.table]

    def predicted_time_exact(self, t_f=1, t_b=2) -> Fraction:
        return sum(self.tick_costs(t_f, t_b), Fraction(0))

    def predicted_time(self, t_f: float = 1.0, t_b: float = 2.0) -> float:
        """Time of one pipelined batch in the lockstep cost model (sum of tick costs)."""
        return float(self.predicted_time_exact(t_f, t_b))

    def ideal_time(self, t_f: float = 1.0, t_b: float = 2.0) -> float:
        """Time without any bubble: m (t_f + t_b)."""
        return self.m * (t_f + t_b)

    def bubble_fraction_exact(self, t_f=1, t_b=2) -> Fraction:
        """(predicted - ideal) / ideal: (p-1)/m for GPipe/1F1B, (p-1)/(v m) interleaved (split B)."""
        ideal = self.m * (Fraction(t_f) + Fraction(t_b))
        return (self.predicted_time_exact(t_f, t_b) - ideal) / ideal

    def bubble_fraction(self, t_f: float = 1.0, t_b: float = 2.0) -> float:
        return float(self.bubble_fraction_exact(t_f, t_b))

    # ---- activation memory --------------------------------------------------------------------
    @functools.cached_property
    def _in_flight(self) -> tuple[int, ...]:
        counts, best = [0] * self.p, [0] * self.p
        for row in self.table:
            for s, op in enumerate(row):
                if op is None:
                    continue
                # a split backward's microbatch stays until its W (it holds the W stash)
                done = op.kind == "W" or (op.completes_backward and op.half != "input")
                counts[s] += 1 if op.kind == "F" else -1 if done else 0
                best[s] = max(best[s], counts[s])
        return tuple(best)

    @functools.cached_property
    def has_weight_ops(self) -> bool:
        """True for zero-bubble tables: backwards split into B (input) and W (weight) ops."""
        return any(op is not None and op.kind == "W" for row in self.table for op in row)

    def max_in_flight(self, stage: int) -> int:
        """Most (microbatch, chunk) pairs on ``stage`` whose forward ran and backward is not done
        (for zero-bubble tables: whose W is not done, since W still needs the activations)."""
        return self._in_flight[stage]

    @property
    def num_stash_slots(self) -> int:
        return self._arrays[4] if self.chunk_pools else max(self._in_flight)

    # ---- executor arrays ------------------------------------------------------------------------
    @functools.cached_property
    def _arrays(self) -> tuple[dict[str, np.ndarray], int, int, int, int]:
        T, p, last = self.num_ticks, self.p, self.last_chunk
        arr = {k: np.zeros((T, p), np.int32) for k in ("op", "mb", "vchunk", "is_first", "is_last")}
        for k in ("stash_slot", "wstash_slot", "fwd_in_slot", "bwd_in_slot", "loss_ct_slot",
                  "fwd_recv_slot", "bwd_recv_slot", "fwd_recv_up_slot", "bwd_recv_down_slot"):
            arr[k] = np.full((T, p), -1, np.int32)
        where: dict[Op, tuple[int, int]] = {}
        for t, row in enumerate(self.table):
            for s, op in enumerate(row):
                if op is not None:
                    where[op] = (t, s)
                    arr["op"][t, s] = _OP_CODE[op.kind, op.half]
                    arr["mb"][t, s], arr["vchunk"][t, s] = op.microbatch, self.local_of(op.chunk)
                    arr["is_first"][t, s], arr["is_last"][t, s] = op.chunk == 0, op.chunk == last
        # the backward op that starts (mb, c)'s backward (takes its incoming gradient) and the
        # one that finishes it (sends the gradient on): the halves, or one op (whole, or a
        # zero-bubble B), per (mb, c), so tables may mix them (zb-phased)
        first_b = {(op.microbatch, op.chunk): ts for op, ts in where.items()
                   if op.kind == "B" and op.half != "lower"}
        final_b = {(op.microbatch, op.chunk): ts for op, ts in where.items()
                   if op.kind == "B" and op.half != "upper"}
        # Intervals (first tick, last tick, stage, key); receive buffers are keyed by the
        # CONSUMER (mb, chunk), so the loss cotangent and the gradient from chunk c+1 share a key.
        # Zero-bubble tables also keep what W needs (B's exported GEMM inputs and output
        # gradients) from B to W: the W stash.
        stash, wstash, fwd_msgs, bwd_msgs, loss_cts = [], [], [], [], []
        for op, (t, s) in where.items():
            mb, c = op.microbatch, op.chunk
            if op.kind == "W":
                wstash.append((where[Op("B", mb, c, "input")][0], t, s, (mb, c)))
            elif op.kind == "F":
                stash.append((t, final_b[mb, c][0], s, (mb, c)))
                if c == last:          # loss cotangent written locally by the forward
                    loss_cts.append((t, first_b[mb, c][0], s, (mb, c)))
                else:                  # activation arrives at the next stage at t+1
                    assert t + 1 < T, "a message is sent at the last tick"
                    t_use, s_use = where[Op("F", mb, c + 1, "full")]
                    fwd_msgs.append((t + 1, t_use, s_use, (mb, c + 1)))
            elif op.half != "upper" and c > 0:   # gradient arrives upstream at t+1
                assert t + 1 < T, "a message is sent at the last tick"
                t_use, s_use = first_b[mb, c - 1]
                bwd_msgs.append((t + 1, t_use, s_use, (mb, c - 1)))
        pool = (lambda key: self.local_of(key[1])) if self.chunk_pools else None
        stash_slot, n_stash = allocate(stash, pool)
        wstash_slot, n_w = allocate(wstash, pool)
        fwd_slot, n_fwd = allocate(fwd_msgs)
        bwd_slot, n_bwd = allocate(bwd_msgs + loss_cts)
        for op, (t, s) in where.items():
            key = (op.microbatch, op.chunk)
            arr["stash_slot"][t, s] = stash_slot[key]
            if self.has_weight_ops and (op.kind == "W" or op.half == "input"):
                arr["wstash_slot"][t, s] = wstash_slot[key]
            if op.kind == "F" and op.chunk > 0:
                arr["fwd_in_slot"][t, s] = fwd_slot[key]
            if op.kind == "F" and op.chunk == last:
                arr["loss_ct_slot"][t, s] = bwd_slot[key]
            if op.kind == "B" and op.half != "lower":
                arr["bwd_in_slot"][t, s] = bwd_slot[key]
        # Arrival channels: activations come down (from stage s-1) and gradients up (from s+1),
        # cyclically for v > 1; ZB-V's chunks p..2p-1 send activations up and gradients down,
        # and the turn (chunk p-1 -> p on stage p-1) arrives on the up channel of stage p-1.
        for msgs, slots, step in ((fwd_msgs, fwd_slot, 1), (bwd_msgs, bwd_slot, -1)):
            for t0, _, s, (mb, c) in msgs:
                down = step == 1 if self.name != "zb-v" else s == self.stage_of(c - step) + 1
                name = {(1, True): "fwd_recv_slot", (1, False): "fwd_recv_up_slot",
                        (-1, False): "bwd_recv_slot", (-1, True): "bwd_recv_down_slot"}[step, down]
                assert arr[name][t0, s] == -1, "two messages arrive at one stage in one tick"
                arr[name][t0, s] = slots[mb, c]
        return arr, n_fwd, n_bwd, n_w, n_stash

    def executor_arrays(self) -> dict[str, np.ndarray]:
        """Per-tick, per-stage int32 control arrays of shape (num_ticks, p); see module docs.

        'op' (0 idle, 1 F, 2 B upper, 3 B lower, 4 B full, 5 B input, 6 W), 'mb', 'vchunk',
        'is_first', 'is_last', 'stash_slot', 'wstash_slot', 'fwd_in_slot', 'bwd_in_slot',
        'loss_ct_slot', 'fwd_recv_slot' (activation from the stage before), 'bwd_recv_slot'
        (gradient from the stage after), and for ZB-V 'fwd_recv_up_slot' (activation from the
        stage after, or the turn's local handoff), 'bwd_recv_down_slot' (gradient from the
        stage before) (-1 where not applicable).
        """
        return {k: a.copy() for k, a in self._arrays[0].items()}

    @property
    def num_fwd_slots(self) -> int:
        return self._arrays[1]

    @property
    def num_bwd_slots(self) -> int:
        return self._arrays[2]

    @property
    def num_wstash_slots(self) -> int:
        """Slots of the W stash (B-to-W data of zero-bubble tables; 1 otherwise)."""
        return self._arrays[3]

    # ---- debugging ----------------------------------------------------------------------------
    def render_text(self) -> str:
        """ASCII grid: rows = stages, columns = ticks. 'F3' forward of microbatch 3, 'b3' upper
        backward half, 'B3' lower half (or unsplit backward), '.' idle; ':k' local chunk if v>1."""
        def cell(op: Op | None) -> str:
            if op is None:
                return "."
            text = ("b" if op.half == "upper" else op.kind) + str(op.microbatch)
            return text + (f":{self.local_of(op.chunk)}" if self.v > 1 else "")
        cells = [[cell(row[s]) for row in self.table] for s in range(self.p)]
        width = max(len(c) for line in cells for c in line)
        return "\n".join(f"stage {s}: " + " ".join(c.ljust(width) for c in line)
                         for s, line in enumerate(cells))

    def __str__(self) -> str:
        return (f"{self.name} p={self.p} v={self.v} m={self.m} split_backward={self.split_backward}"
                f" ticks={self.num_ticks}\n{self.render_text()}")


def check_table(cfg) -> None:
    """ConfigError where the config's schedule has no tick table (zb-v's list scheduler can
    fail for some p and m), before any compile; the table is cached for the executor."""
    p = cfg.parallel
    if p.schedule != "zb-v" or p.virtual_stages != 2 or p.pipe < 2:
        return
    try:
        build_schedule("zb-v", p.pipe, cfg.num_microbatches, 2)
    except RuntimeError as e:
        from ptdp_jax.config.schema import ConfigError
        raise ConfigError(f"parallel.schedule=zb-v has no table for parallel.pipe={p.pipe} and "
                          f"{cfg.num_microbatches} microbatches ({e}); try another number of "
                          f"microbatches or parallel.schedule=zb-h1") from None
