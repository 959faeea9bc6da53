"""train.recompute=offload under pipelining: the residuals that selective recomputation keeps
and the offload policy names wait in the host's pinned memory between a microbatch's forward
and its backward; the device holds the rest of the stash and a few chunks' worth in transit.

A host buffer never enters the tick's switch (XLA computes on the host what a conditional does
to host buffers), so a tick moves residuals before its switch, both ways, where the copies can
overlap its op:

    store   the previous tick's forward residuals (`pending`) into their host slot
    fetch   the host slot that the next tick's backward reads, to the device (`incoming` of
            the next tick)
    op      a forward leaves its residuals in `pending`; a backward reads `incoming`, or
            `pending` where they are the previous tick's forward's (`forwarded`: a stage's
            turn from a microbatch's forward to its backward)

The control columns for this (`with_host_columns`, per tick and stage, -1 the trash slot) follow
the ticks in the order they run (`run_order`), which is the table's for the lockstep loop and
warm-up, (forward, backward) pairs, cool-down for the phased ones.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.pipeline import schedule as S
from ptdp_jax.pipeline.phased import phased_parts

READS = (S.BWD_UPPER, S.BWD_LOWER, S.BWD_FULL, S.BWD_INPUT)   # ops that read residuals
HOST_COLUMNS = ("host_store_slot", "host_fetch_slot", "host_forwarded")


def in_host_memory(aval) -> bool:
    """Whether a traced value lives in host memory (a residual the offload policy moved)."""
    return getattr(aval, "memory_space", None) == jax.memory.Space.Host


def _kind(a) -> tuple:
    return tuple(a.shape), str(a.dtype)


def host_leaves(kept, offloaded) -> tuple:
    """Per leaf of selective's residuals (`kept`), whether it goes to the host: as many of each
    shape and dtype as the offload policy's residuals (`offloaded`, the same leaves in another
    order) hold in host memory, the first of each kind (the layer's input) left on the device.
    Leaves of one shape and dtype weigh the same, so which of them moves changes no byte."""
    key = _kind
    moves = {}
    for a in offloaded:
        moves[key(a)] = moves.get(key(a), 0) + in_host_memory(a)
    assert sorted(map(key, kept)) == sorted(map(key, offloaded)), "offload changed the residuals"
    left = {k: sum(key(a) == k for a in kept) - n for k, n in moves.items()}
    out = []
    for a in kept:
        out.append(left[key(a)] <= 0)
        left[key(a)] -= 1
    return tuple(out)


def run_order(sched) -> np.ndarray:
    """The table's rows in the order the executor runs them."""
    if sched.name not in S.PHASED:
        return np.arange(sched.num_ticks)
    warm, fwd, bwd, cool = phased_parts(sched.p, sched.m, sched.v)
    pairs = [r for pair in zip(fwd, bwd) for r in pair]
    return np.asarray(list(warm) + pairs + list(cool), np.int64)


def with_host_columns(table: dict, branches: list, order: np.ndarray) -> dict:
    """table with the host stash's columns (ticks, p): host_store_slot (the slot of the
    previous tick's forward), host_fetch_slot (the slot of the next tick's backward, unless
    forwarded), host_forwarded (1 where a backward reads the previous tick's forward's)."""
    ops = np.asarray([br.op for br in branches])[table["branch"]]        # (ticks, p)
    slot = table["stash_slot"]
    writes = np.where(ops == S.FWD, slot, -1)[order]                    # in run order
    reads = np.where(np.isin(ops, READS), slot, -1)[order]
    before = np.concatenate([np.full_like(writes[:1], -1), writes[:-1]])
    forwarded = (reads >= 0) & (reads == before)
    fetch = np.where(forwarded, -1, reads)
    fetch = np.concatenate([fetch[1:], np.full_like(fetch[:1], -1)])
    out = dict(table)
    for name, col in zip(HOST_COLUMNS, (before, fetch, forwarded.astype(np.int32))):
        placed = np.empty_like(col)
        placed[order] = col
        out[name] = placed.astype(np.int32)
    return out


class Transit(NamedTuple):
    """The scan carry's host part."""
    host: tuple             # pinned host buffers (n, S+1, ...), one per shape and dtype of the
                            #   offloaded leaves (n: of them in all layers), by stash slot
    pending: tuple          # device: [Lmax] the last forward's leaves, stored the tick after
    incoming: tuple         # device: [Lmax] the leaves this tick's backward reads


class HostStash:
    """Which of a layer's residual leaves go to the host (`on_host`), where each layer's lie in
    the host buffers (`place`), and the moves of `Transit`. Leaves of one shape and dtype share
    a buffer: XLA gives buffers made alike one allocation and copies it, on the host, for each
    further one, every step."""

    def __init__(self, on_host: tuple, residuals, n_layers: int):
        """residuals: one layer's leaves (selective's), as ShapeDtypeStructs."""
        self.on_host = on_host
        moved = self.split(residuals)[1]
        self.kinds = sorted(set(map(_kind, moved)))        # one buffer each: (shape, dtype)
        rows = dict.fromkeys(self.kinds, 0)
        place = []                                          # [layer][leaf]: (buffer, row)
        for _ in range(n_layers):
            place.append([])
            for a in moved:
                place[-1].append((self.kinds.index(_kind(a)), rows[_kind(a)]))
                rows[_kind(a)] += 1
        self.place, self.rows, self.moved = place, rows, moved

    def split(self, leaves) -> tuple:
        """(the leaves the device stash keeps, those that go to the host)."""
        return (tuple(a for a, h in zip(leaves, self.on_host) if not h),
                tuple(a for a, h in zip(leaves, self.on_host) if h))

    def join(self, kept, moved) -> tuple:
        kept, moved = iter(kept), iter(moved)
        return tuple(next(moved) if h else next(kept) for h in self.on_host)

    def host_bytes(self, n_slots: int) -> int:
        """The pinned host memory of the buffers."""
        return sum(self.rows[k] * (n_slots + 1) * int(np.prod(k[0])) * np.dtype(k[1]).itemsize
                   for k in self.kinds)

    def make(self, alloc, zeros, n_slots: int) -> Transit:
        """alloc / zeros: (shape, dtype) -> a device buffer (the host's are zeros moved there)."""
        host = tuple(jax.device_put(zeros((self.rows[k], n_slots + 1) + k[0], k[1]),
                                    jax.memory.Space.Host) for k in self.kinds)
        device = lambda: tuple(tuple(alloc(a.shape, a.dtype) for a in self.moved)
                               for _ in self.place)
        return Transit(host, device(), device())

    def move(self, tr: Transit, ctl) -> tuple[Transit, tuple]:
        """Before the switch: `pending` stored, the next tick's leaves fetched (returned, to
        become `incoming` after the switch). XLA's host offloader makes a DMA of a
        dynamic-update-slice whose update comes straight from the device and of a
        dynamic-slice that goes straight to it; anything between it computes on the host."""
        host = list(tr.host)
        for l, places in enumerate(self.place):
            for (g, row), a in zip(places, tr.pending[l]):
                update = jax.device_put(a[None, None], jax.memory.Space.Host)
                host[g] = jax.lax.dynamic_update_slice(
                    host[g], update, (row, ctl.host_store_slot) + (0,) * a.ndim)
        fetched = tuple(tuple(
            jax.device_put(jax.lax.dynamic_slice(host[g], (row, ctl.host_fetch_slot) + (0,) *
                                                 (host[g].ndim - 2), (1, 1) + host[g].shape[2:]),
                           jax.memory.Space.Device)[0, 0] for g, row in places)
            for places in self.place)
        return tr._replace(host=tuple(host)), fetched

    def read(self, tr: Transit, ctl, layer: int) -> tuple:
        """A backward's leaves of one layer: `incoming`, or `pending` where forwarded."""
        return tuple(jnp.where(ctl.host_forwarded == 1, p, i)
                     for p, i in zip(tr.pending[layer], tr.incoming[layer]))

    def write(self, tr: Transit, layer: int, moved: tuple) -> Transit:
        pending = tr.pending[:layer] + (moved,) + tr.pending[layer + 1:]
        return tr._replace(pending=pending)
