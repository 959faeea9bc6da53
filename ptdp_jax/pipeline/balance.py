"""How many layers each model chunk holds: even, explicit (`parallel.stage_layers`) or
balanced (`parallel.stage_layers=auto`).

In lockstep every tick lasts as long as its slowest op, so the first stage's embedding and
the last stage's head and loss stretch every tick they run in. `auto` plays the schedule's
tick table with a cost per op and moves layers between chunks while the predicted step gets
shorter (Megatron's `--account-for-embedding-in-pipeline-split` and
`--decoder-first/last-pipeline-num-layers`, found by search instead of by hand).

Costs are in units of one layer's forward on one microbatch (FLOPs from the model's shapes):

    F   of a chunk of n layers:      n          (+ the whole head and loss on the last chunk,
                                                 unless the head is spread over the stages)
    one backward half (ceil/floor):  bwd * n_h  (+ the embedding gradient on the first chunk)

`bwd` is the backward/forward cost ratio of a layer per recompute mode (the 1.3B GPT on H100,
2026-11-26: about 2 without recomputation, 2.5-2.7 with selective, 3 with full).
"""
from __future__ import annotations

from ptdp_jax.models.model import even_chunk_layers
from ptdp_jax.pipeline.head import spread_over_pipe
from ptdp_jax.pipeline.schedule import build_schedule
from ptdp_jax.pipeline.schedule import chunk_placement as _placement

BACKWARD_COST = {"none": 2.0, "selective": 2.5, "offload": 2.5, "full": 3.0}
CE_OVERHEAD = 1.15            # softmax / cross-entropy element-wise work on top of the logits GEMM


def chunk_layers(cfg) -> tuple[int, ...]:
    """Layers of each global model chunk (p * v entries, in chunk order; chunk c on stage
    `chunk_placement(cfg)[c][0]`: c % p, or for ZB-V c or 2p-1-c)."""
    par, L = cfg.parallel, cfg.model.num_layers
    p, v = par.pipe, par.virtual_stages
    if par.stage_layers == "auto" and p * v > 1:
        return auto_chunk_layers(cfg)
    if par.stage_layers and par.stage_layers != "auto":
        return tuple(int(n) for n in par.stage_layers)
    return even_chunk_layers(L, p, v)


def chunk_placement(cfg) -> tuple[tuple[int, int], ...]:
    """(stage, virtual chunk) of each global model chunk under parallel.schedule."""
    par = cfg.parallel
    return _placement(par.schedule, par.pipe, par.virtual_stages)


def op_costs(cfg) -> dict[str, float]:
    """Per-op costs in layer-forward units: 'head' (F of the last chunk, fwd + bwd of the
    logits and loss), 'embed' (backward of the embedding), 'bwd' (a layer's backward)."""
    m = cfg.model
    h, f, s, V = m.hidden_size, m.ffn, m.seq_len, m.vocab_size
    mats = 4 * h * h + (3 if m.arch == "llama" else 2) * h * f
    layer_fwd = 2 * mats + 2 * s * h                    # per token; causal attention ~ half of 4 s h
    head_fwd = 2 * h * V
    # With the head spread over every stage (pipeline/head.py) it weighs on all stages alike
    # and does not move the balance.
    head = 0.0 if spread_over_pipe(cfg) else 3 * CE_OVERHEAD * head_fwd / layer_fwd
    return {"head": head, "embed": 0.05, "bwd": BACKWARD_COST[cfg.recompute]}


def predicted_step(schedule, counts, costs) -> float:
    """Sum over ticks of the slowest op (lockstep), in layer-forward units."""
    last, total = schedule.p * schedule.v - 1, 0.0
    for row in schedule.table:
        slowest = 0.0
        for op in row:
            if op is None:
                continue
            n = counts[op.chunk]
            if op.kind == "F":
                cost = n + (costs["head"] if op.chunk == last else 0.0)
            elif op.kind == "W" or op.half == "input":     # zero bubble: B and W halve a backward
                cost = costs["bwd"] * n / 2
            else:
                layers = {"upper": n - n // 2, "lower": n // 2, "full": n}[op.half]
                cost = costs["bwd"] * layers
                if op.chunk == 0 and op.completes_backward:
                    cost += costs["embed"]
            slowest = max(slowest, cost)
        total += slowest
    return total


def auto_chunk_layers(cfg) -> tuple[int, ...]:
    """Local search from the even split: move one layer between two chunks while the
    predicted lockstep step gets shorter. Every chunk keeps at least one layer (two where an
    even split has two or more, so every backward can still be split into halves)."""
    par, L = cfg.parallel, cfg.model.num_layers
    p, v = par.pipe, par.virtual_stages
    k = p * v
    # The balance hardly depends on m beyond a few rounds; a short table keeps the search fast.
    m = min(cfg.num_microbatches, 2 * p)
    minimum = 2 if L >= 2 * k else 1
    sched = build_schedule(par.schedule, p, m, v, split_backward=minimum >= 2)
    costs = op_costs(cfg)
    counts = [L // k + (1 if c < L % k else 0) for c in range(k)]
    best = predicted_step(sched, counts, costs)
    improved = True
    while improved:
        improved = False
        for a in range(k):
            for b in range(k):
                if a == b or counts[a] <= minimum:
                    continue
                counts[a] -= 1
                counts[b] += 1
                t = predicted_step(sched, counts, costs)
                if t < best - 1e-9:
                    best, improved = t, True
                else:
                    counts[a] += 1
                    counts[b] -= 1
    return tuple(counts)
