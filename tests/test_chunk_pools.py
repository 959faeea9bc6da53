"""Stash slots in a pool per local chunk (Schedule.chunk_pools, on where tuning.static_stash
gives a branch per (op, chunk, slot) and v > 1): the same table, fewer branches, a slot only
ever holding one chunk's residuals."""
from __future__ import annotations

import numpy as np

from ptdp_jax.pipeline.routing import control_table
from ptdp_jax.pipeline.schedule import build_schedule
from test_schedule import _simulate_executor

CASES = [("1f1b-phased", 2, 4, 2), ("1f1b-phased", 4, 8, 2), ("1f1b-phased", 4, 32, 3),
         ("1f1b-phased", 3, 6, 4), ("zb-phased", 4, 16, 2), ("zb-phased", 4, 8, 3),
         ("interleaved", 4, 8, 2), ("zb-v", 4, 8, 2)]


def _chunks_per_slot(s, slot_key):
    a, seen = s.executor_arrays(), {}
    for t in range(s.num_ticks):
        for st in range(s.p):
            if a[slot_key][t, st] >= 0:
                seen.setdefault(int(a[slot_key][t, st]), set()).add(int(a["vchunk"][t, st]))
    return seen


def test_pooled_tables_replay_with_one_chunk_a_slot():
    for name, p, m, v in CASES:
        plain = build_schedule(name, p, m, v)
        pooled = build_schedule(name, p, m, v, chunk_pools=True)
        assert pooled.table == plain.table, name
        if name != "zb-v":                  # (the replay follows one-way routing only)
            _simulate_executor(pooled)      # every read finds what was written, slots freed
        for key in ("stash_slot", "wstash_slot"):
            per_slot = _chunks_per_slot(pooled, key)
            assert all(len(c) == 1 for c in per_slot.values()), (name, p, m, v, key, per_slot)
        # pools cost a few slots: at most one chunk's worth of peak per chunk
        assert plain.num_stash_slots <= pooled.num_stash_slots <= v * plain.num_stash_slots


def test_v1_pools_change_nothing():
    for name, p, m in (("1f1b-phased", 4, 16), ("zb-phased", 4, 16), ("1f1b", 4, 8)):
        a = build_schedule(name, p, m).executor_arrays()
        b = build_schedule(name, p, m, chunk_pools=True).executor_arrays()
        assert all(np.array_equal(a[k], b[k]) for k in a), name


def test_pools_cut_the_static_stash_branches():
    """The 7.5B's interleaved-in-phases layout: p 4, v 3, m 32, 3 layers a chunk."""
    counts = [3] * 12
    plain = control_table(build_schedule("1f1b-phased", 4, 32, 3), counts, static_stash=True)[0]
    pooled = control_table(build_schedule("1f1b-phased", 4, 32, 3, chunk_pools=True), counts,
                           static_stash=True)[0]
    assert (len(plain), len(pooled)) == (123, 56)
    assert sum(b.n_layers for b in pooled) < 0.5 * sum(b.n_layers for b in plain)


def test_memory_counts_the_slots_the_executor_allocates():
    from ptdp_jax.training.memory import stash_slots
    from ptdp_jax.pipeline.executor import schedule_for
    from ptdp_jax.run.loop import resolve_config
    for ov in ({"parallel.virtual_stages": 3}, {"parallel.virtual_stages": 1},
               {"parallel.virtual_stages": 3, "tuning.static_stash": False}):
        cfg = resolve_config("configs/gpt-7.5b.yaml", (1, 4, 1), {
            "train.global_batch_size": 32, "train.micro_batch_size": 1,
            "parallel.schedule": "1f1b-phased", **ov})
        trash = 0 if cfg.static_stash_on else 1
        assert stash_slots(cfg) == schedule_for(cfg).num_stash_slots + trash, ov
    assert schedule_for(cfg).chunk_pools is False       # the indexed stash needs no pools
