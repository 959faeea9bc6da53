"""The executor's two stashes, kept one of two ways (`stash_store`, chosen once a step):
the residual stash (a forward's residuals of each layer, read by that microbatch's backward)
and the W stash (each GEMM's (x, dy) of each layer, written by a zero-bubble B, read by its W).

    IndexedStash  one stacked (S+1, ...) buffer per layer and leaf; the slot is a column of the
                  tick's control row: the producer writes a temporary that a
                  dynamic-update-slice copies in, the consumer reads a copy
    StaticStash   a buffer per (slot, layer, leaf); the slot is the switch branch's, fixed
                  at trace time (a switch branch per (op, slot)), so that the
                  layers' kernels write and read the residuals in place

An entry is one layer's leaves: a tuple of arrays (residuals) or {GEMM weight: (x, dy)}
(W stash). Both stores put and get whole entries by (branch, tick control, layer); `slot` names
the slot field both carry ('stash_slot' or 'wstash_slot').
"""
from __future__ import annotations

from typing import Callable

from ptdp_jax.pipeline.pipe_state import replace_at


def map_entry(f, entry, *others):
    """f over an entry's leaves (tuples and dicts, in the entry's own order), zipped with
    entries of the same structure."""
    if isinstance(entry, dict):
        return {k: map_entry(f, a, *(o[k] for o in others)) for k, a in entry.items()}
    if isinstance(entry, (tuple, list)):
        return tuple(map_entry(f, a, *(o[i] for o in others)) for i, a in enumerate(entry))
    return f(entry, *others)


class IndexedStash:
    """Store layout [Lmax] entry of (n+1, ...) buffers; the slot from the tick's control."""

    def __init__(self, slot: str):
        self.slot = slot

    def make(self, alloc: Callable, entry, n_layers: int, n_slots: int) -> tuple:
        """entry: one layer's leaves as ShapeDtypeStructs; alloc(shape, dtype) -> a buffer."""
        return tuple(map_entry(lambda a: alloc((n_slots + 1,) + a.shape, a.dtype), entry)
                     for _ in range(n_layers))

    def put(self, store, br, ctl, layer: int, entry) -> tuple:
        slot = getattr(ctl, self.slot)
        return replace_at(store, layer,
                          map_entry(lambda a, buf: buf.at[slot].set(a), entry, store[layer]))

    def get(self, store, br, ctl, layer: int):
        slot = getattr(ctl, self.slot)
        return map_entry(lambda buf: buf[slot], store[layer])


class StaticStash:
    """Store layout [n][Lmax] entry; the slot is the branch's (a trace-time constant)."""

    def __init__(self, slot: str):
        self.slot = slot

    def make(self, alloc: Callable, entry, n_layers: int, n_slots: int) -> tuple:
        return tuple(tuple(map_entry(lambda a: alloc(a.shape, a.dtype), entry)
                           for _ in range(n_layers)) for _ in range(n_slots))

    def put(self, store, br, ctl, layer: int, entry) -> tuple:
        slot = getattr(br, self.slot)
        return replace_at(store, slot, replace_at(store[slot], layer, entry))

    def get(self, store, br, ctl, layer: int):
        return store[getattr(br, self.slot)][layer]


def stash_store(static: bool, slot: str):
    """The store of one stash: static (a buffer per slot) or indexed per tick."""
    return StaticStash(slot) if static else IndexedStash(slot)
