"""The executor's per-tick control and message routing: which `lax.switch` branch each stage
runs at each tick (`control_table`), and where messages go (`Router`).

Two channels, one `ppermute` each per tick, each carrying one (b, s, h) message:

    down   stage s -> s+1: activations (and, in ZB-V's second leg, gradients)
    up     stage s -> s-1: gradients (and, in ZB-V's second leg, activations)

Megatron's placement (chunk c on stage c % p) sends every activation down and every gradient
up; with v > 1 both rings are cyclic (the last stage's chunk output goes to stage 0), with
v = 1 they are not. ZB-V (chunk c < p on stage c, chunk c >= p on stage 2p-1-c) sends the
first leg's activations down and its gradients up, the second leg's the other way, on
non-cyclic rings; at the turn (stage p-1: chunk p-1 -> p forward, p -> p-1 backward) the
message stays on the stage: what it put in its down buffer comes back to it on the up
channel, the tick after, like any message. The receiving side's control columns say for
each channel whether the arrival is an activation (-> a forward receive slot) or a gradient
(-> a backward receive slot).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.pipeline import schedule as S

MSG = ("act_batch", "act_seq", "embed")  # stage-to-stage message (b, s, h), a layer's output
MSG_SCATTERED = ("act_batch", "act_seq", "embed_sg")  # split over 'tensor' (scatter/gather;
                                     # under sequence parallelism already split by rows or seq)

TWO_WAY = ("fwd_recv_up_slot", "bwd_recv_down_slot")   # control columns of ZB-V only


@dataclass(frozen=True)
class Branch:
    """One `lax.switch` branch: an op on one virtual chunk with a given layer count."""
    op: int           # schedule.IDLE / FWD / BWD_UPPER / BWD_LOWER / BWD_FULL / BWD_INPUT / ...
    vchunk: int = 0
    n_layers: int = 0
    first: bool = False   # global chunk 0: embedding in, embedding gradient out
    last: bool = False    # last global chunk: head and loss
    stash_slot: int = -1  # static stash: the residual stash slot this branch writes (forward)
                          #   or reads (backward), fixed at trace time; -1: indexed per tick
    wstash_slot: int = -1  # static stash: the W stash slot a B writes or a W reads


class TickControl(NamedTuple):
    """One tick's row for this stage (int32 scalars; slot -1 = the trash row)."""
    branch: jax.Array
    mb: jax.Array
    first_layer: jax.Array      # global index of the chunk's first layer (dropout keys)
    stash_slot: jax.Array
    wstash_slot: jax.Array      # zero-bubble tables: B-to-W slot
    fwd_in_slot: jax.Array
    bwd_in_slot: jax.Array
    loss_ct_slot: jax.Array
    fwd_recv_slot: jax.Array    # the down channel's arrival (an activation) -> this slot
    bwd_recv_slot: jax.Array    # the up channel's arrival (a gradient) -> this slot
    head_tick: jax.Array        # 1 where the last chunk runs a forward anywhere (same on all stages)
    head_mb: jax.Array          # that forward's microbatch
    fwd_recv_up_slot: jax.Array | None = None    # ZB-V: the up channel's arrival, an activation
    bwd_recv_down_slot: jax.Array | None = None  # ZB-V: the down channel's arrival, a gradient
    host_store_slot: jax.Array | None = None  # offload: pipeline/host_stash.py's columns
    host_fetch_slot: jax.Array | None = None
    host_forwarded: jax.Array | None = None


def two_way(sched: S.Schedule) -> bool:
    """Whether both channels carry activations and gradients (ZB-V's V placement)."""
    return sched.name == "zb-v"


STASH_OPS = (S.FWD, S.BWD_UPPER, S.BWD_LOWER, S.BWD_FULL, S.BWD_INPUT)   # write / read the stash


def control_table(sched: S.Schedule, counts, static_stash: bool = False
                  ) -> tuple[list[Branch], dict[str, np.ndarray]]:
    """The branch list (0 = idle) and the (ticks, p) int32 arrays of TickControl.
    static_stash: one branch per (op, stash slot), so that the slot is a trace-time constant."""
    arr = sched.executor_arrays()
    p, T = sched.p, sched.num_ticks
    starts = np.cumsum((0,) + tuple(counts))
    branches, index = [Branch(S.IDLE)], {Branch(S.IDLE): 0}
    out = {k: np.zeros((T, p), np.int32) for k in ("branch", "first_layer", "head_tick", "head_mb")}
    for t in range(T):
        for s in range(p):
            if arr["op"][t, s] == S.IDLE:
                continue
            c, op = sched.chunk_at(s, int(arr["vchunk"][t, s])), int(arr["op"][t, s])
            # first / last only where the op uses them (one branch less to compile and to
            # record into the tick's command buffer per distinction dropped)
            first = bool(arr["is_first"][t, s]) and op in (S.FWD, S.BWD_LOWER, S.BWD_FULL,
                                                             S.BWD_INPUT)
            last = bool(arr["is_last"][t, s]) and op == S.FWD
            slot = int(arr["stash_slot"][t, s]) if static_stash and op in STASH_OPS else -1
            wslot = (int(arr["wstash_slot"][t, s]) if static_stash and op in (S.BWD_INPUT,
                                                                            S.BWD_WEIGHT) else -1)
            br = Branch(op, int(arr["vchunk"][t, s]), int(counts[c]), first, last, slot, wslot)
            if br not in index:
                index[br] = len(branches)
                branches.append(br)
            out["branch"][t, s], out["first_layer"][t, s] = index[br], starts[c]
            if br.op == S.FWD and br.last:
                out["head_tick"][t, :], out["head_mb"][t, :] = 1, arr["mb"][t, s]
    for k in TickControl._fields:
        if k not in out and k in arr and (k not in TWO_WAY or two_way(sched)):
            out[k] = arr[k]
    return branches, out


class Router:
    """The two channels of one tick: `receive` files last tick's arrivals (`Wire`) into their
    slots (`Inbox`), `send` moves this tick's send buffers (pipeline/pipe_state.py).

    On CPU devices the sends are ordered: after the tick's head (its collectives run in a
    conditional) and the up channel after the down one. XLA:CPU runs independent operations
    concurrently, so without an order one device can enter a permute while another enters the
    head's all-reduce, and both wait for ever (seen in CI: a worker idle, its 8 device threads
    parked in CollectivePermute and AllReduce rendezvous). GPUs run every device's collectives
    in the one order of the compiled schedule, so their program is left as it is."""

    def __init__(self, sched: S.Schedule, sh, scatter_gather: bool):
        p = sched.p
        self.two_way, self.turn, self.sh, self.sg = two_way(sched), p - 1, sh, scatter_gather
        self.ordered = sh.mesh is not None and sh.mesh.devices.flat[0].platform == "cpu"
        if sched.v > 1 and not self.two_way:
            self.down_perm = [(i, (i + 1) % p) for i in range(p)]
            self.up_perm = [(i, (i - 1) % p) for i in range(p)]
        else:
            self.down_perm = [(i, i + 1) for i in range(p - 1)]
            self.up_perm = [(i + 1, i) for i in range(p - 1)]

    def send_field(self, br: Branch) -> str:
        """The send buffer of a branch's output: activations down, gradients up (ZB-V's
        second leg, local chunk 1, the other way round)."""
        up = (br.op != S.FWD) != (self.two_way and br.vchunk == 1)
        return "send_up" if up else "send_down"

    def receive(self, inbox, wire, c: TickControl, channels=("down", "up")):
        """The inbox with the arrivals of `channels` filed into their slots (all but two-way
        tables may leave one for later)."""
        fwd, bwd = inbox.fwd, inbox.bwd
        if "down" in channels:
            fwd = fwd.at[c.fwd_recv_slot].set(wire.recv_down)
        if "up" in channels:
            bwd = bwd.at[c.bwd_recv_slot].set(wire.recv_up)
        if self.two_way:
            assert set(channels) == {"down", "up"}
            fwd = fwd.at[c.fwd_recv_up_slot].set(wire.recv_up)
            bwd = bwd.at[c.bwd_recv_down_slot].set(wire.recv_down)
        return inbox._replace(fwd=fwd, bwd=bwd)

    def _move(self, msg, perm):
        sh = self.sh
        if self.sg:   # scatter/gather: each tensor rank sends 1/t of the message, all-gather on arrival
            msg = sh.constrain(msg, MSG_SCATTERED)
            out = jax.lax.ppermute(msg, "pipe", perm)
            return sh.constrain(sh.constrain(out, MSG_SCATTERED), MSG)
        return jax.lax.ppermute(msg, "pipe", perm)

    def send(self, wire, after, stage, channels=("down", "up")):
        """The wire with this tick's arrivals: the send buffers of `channels` moved, each
        ordered on CPU after `after` (the loss sum, which the tick's head updates).
        channels: the ones this tick can use (a phased table's forward rows send nothing
        up, its backward rows nothing down); the other keeps its last arrival, which the
        control table sends to the trash slot. Not sending it also keeps a permute of a
        constant (a warm-up's untouched up buffer) from running ahead of the tick's op on CPU:
        seen as an abort in the test suite, with 1f1b-phased's one-row warm-up unrolled into
        the entry computation, past the ordering barrier below (the loss is not touched in a
        warm-up tick)."""
        send_down, send_up = wire.send_down, wire.send_up
        if self.ordered:      # after the head (it updates the loss), the up channel after down
            (send_down, send_up), _ = jax.lax.optimization_barrier(
                ((send_down, send_up), after))
        down = self._move(send_down, self.down_perm) if "down" in channels else wire.recv_down
        if self.ordered:
            send_up, _ = jax.lax.optimization_barrier((send_up, down))
        up = self._move(send_up, self.up_perm) if "up" in channels else wire.recv_up
        if self.two_way:    # the turn: stage p-1's down buffer comes back to it on the up channel
            up = jnp.where(stage == self.turn, send_down, up)
        return wire._replace(recv_down=down, recv_up=up)
