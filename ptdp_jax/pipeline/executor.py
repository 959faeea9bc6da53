"""The pipeline executor: any schedule table, played by every stage in lockstep inside the train
step's `shard_map` (manual over 'pipe' and 'data'; 'tensor' stays automatic, so tensor
parallelism still comes from the sharding annotations). `pipeline_grads` is one `lax.scan` over
the table's ticks (or three, for the phased tables) whose carry is a `PipeState`
(pipeline/pipe_state.py). A tick, on every stage (`Ticks.tick`), is four steps:

    receive   last tick's arrivals go into their receive slots              (Router.receive)
    run op    one `lax.switch` over the stage's branch: idle, a forward, a backward or a
              backward half of one model chunk, a zero-bubble B or W        (stage_ops.py)
    commit    the arrivals held back from the switch are filed; the head over the pipe runs
              where a last-chunk forward ran anywhere                       (head.py)
    send      one `ppermute` down (stage s -> s+1) and one up (s -> s-1)    (Router.send)

How each part of the state moves in one tick ((b, s, h) a microbatch's activation; F, B, S, SW
the schedule's slot counts; "+1" the trash row that idle stages write):

    wire.recv_down, recv_up  (b,s,h)     receive: copied into the inbox at the row's receive
                                          slots; send: replaced by this tick's arrivals
    inbox.fwd  (F+1,b,s,h)               receive: one slot written; a forward reads its input
    inbox.bwd  (B+1,b,s,h)               receive: one slot written; a backward reads its input;
                                          the head writes dy of the loss into the loss slot
    wire.send_down, send_up  (b,s,h)     run op: a chunk's output or input gradient; send:
                                          permuted to the neighbour (activations down, gradients
                                          up; ZB-V's second leg the other way, routing.py)
    mid  (b,s,h)                         an upper backward half writes, the lower half reads
    head_y  (b,s,h)                      a last-chunk forward writes, commit's head reads
    stash  [Lmax] (S+1, ...) or [S][Lmax] a forward writes each layer's residuals in one slot,
                                          the backward of that microbatch and chunk reads them
    wstash (W ops only)                  B writes each GEMM's (x, dy), W reads them
    transit (recompute=offload only)     before the switch: the last forward's offloaded
                                          leaves to their host slot, the next backward's
                                          fetched (pipeline/host_stash.py)
    sums  (float32)                      backward and W add layer gradients; the head adds the
                                          loss and the head / embedding gradients; chunk 0's
                                          backward scatter-adds the embedding gradient

Each mode is chosen once a step, not per tick (`PipelineModes`, resolved by the caller, and
the table itself):

    loops      `run_lockstep` (one scan over the rows), or for 1f1b-phased and zb-phased
               `run_phased`: the warm-up's forward rows, the steady (forward row, backward row)
               pairs, the cool-down's backward rows (pipeline/phased.py). A forward row sends
               down only, a backward row up only; the head runs unconditionally after the
               forward row (every such row holds a last-chunk forward: no conditional holding
               collectives, so no host round trip per tick). With v > 1 only every v-th group of
               p pairs holds a head, which then runs in a conditional (one host round trip a
               forward row: loops of their own for the pairs with and without a head tripled
               the compile).
    stash      static (static_stash: a buffer per slot and a branch per (op, slot), so
               the layers' kernels write and read the residuals in place) or indexed by the
               tick's slot (pipeline/stash.py); its slots are the schedule's in-flight bound
               (`num_stash_slots`), not m
    backward   whole, or split into B and W for tables with W ops (stage_ops.py)
    head       in the last chunk's forward branch, or over the pipe: every stage takes 1/p of
               the vocabulary (head.py), run after the forward rows ("every row"), where due
               (in a conditional: one predicate on every stage, so collectives inside are fine)
               or never (rows without a last-chunk forward)
    late       overlap_p2p (phased): the forward row's arrival is filed after the
               backward row's op, so that its permute need not end before that op
    buffers    uninitialised (empty_buffers, 'tensor' 1) or zeros

There is one switch per tick and no other conditional but the head's: a buffer passes through
exactly one branch, which either leaves it alone (no copy) or updates one slot of it in place.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.config import decisions as D
from ptdp_jax.models import fp8 as F8
from ptdp_jax.models import model as M
from ptdp_jax.models.dense import MasterGrad, Probe
from ptdp_jax.models.residuals import Residuals
from ptdp_jax.pipeline import schedule as S
from ptdp_jax.pipeline.balance import chunk_layers
from ptdp_jax.pipeline.head import VocabSlices, spread_over_pipe
from ptdp_jax.pipeline.phased import head_pairs, phased_parts
from ptdp_jax.pipeline.pipe_state import (Inbox, PipeState, Sums, Wire, empty_buffer,
                                          grads_of)
from ptdp_jax.pipeline.routing import (  # noqa: F401  (re-exported)
    MSG, MSG_SCATTERED, Branch, Router, TickControl, control_table)
from ptdp_jax.pipeline.stage_ops import (HeadSums, PipeHead, SplitBackward, StageOps,
                                         WholeBackward)
from ptdp_jax.pipeline.host_stash import HostStash, host_leaves, run_order, with_host_columns
from ptdp_jax.pipeline.stash import stash_store
from ptdp_jax.parallel.sharding import vary


@dataclass(frozen=True)
class PipelineModes:
    """The executor's modes, resolved by the caller (the results are the same bit for bit)."""
    static_stash: bool      # a buffer per stash slot and a branch per (op, slot)
    overlap_p2p: bool       # phased tables: a forward row's arrival filed after the backward op
    empty_buffers: bool     # buffers written before read start uninitialised ('tensor' 1 only)


def schedule_for(cfg) -> S.Schedule:
    p, v = cfg.parallel.pipe, cfg.parallel.virtual_stages
    return S.build_schedule(cfg.parallel.schedule, p, cfg.num_microbatches, v,
                            split_backward=min(chunk_layers(cfg)) >= 2,
                            chunk_pools=cfg.stash_chunk_pools)


# ----------------------------------------------------------------------------- the executor

def pipeline_grads(cfg, sh, params, batch_rs1, keys_r, modes: PipelineModes):
    """Loss sum and gradient sums of this data-parallel replica's microbatches: the gradient
    path of p > 1 (ptdp_jax/training/grads.py's contract).

    params: stage-local float32 ('layers' (1, v, Lmax, ...)), varying over 'pipe' and 'data'.
    batch_rs1: this replica's rows (B/d, s+1). Returns (loss_sum, grads) with the structure
    of params; embed/head gradients still to be psum'd over 'pipe'."""
    sched = schedule_for(cfg)
    branches, table = control_table(sched, chunk_layers(cfg), static_stash=modes.static_stash)
    stage = jax.lax.axis_index("pipe")
    router = Router(sched, sh, cfg.parallel.scatter_gather and cfg.parallel.tensor > 1)
    ops = _stage_ops(cfg, sh, params, batch_rs1, keys_r, sched, modes, stage, router)
    if ops.host is not None:
        table = with_host_columns(table, branches, run_order(sched))
    uninitialised = modes.empty_buffers and cfg.parallel.tensor == 1
    alloc = (_uninitialised if uninitialised else _zeros)(ops.manual)
    state = initial_state(ops, sched, alloc, ops.tokens.shape[1], cfg.model)
    ticks = Ticks(ops, router, stage, _slot_sizes(sched), [ops.branch(br) for br in branches])
    if sched.name in S.PHASED:
        state = run_phased(ticks, state, table, sched, modes.overlap_p2p)
    else:
        state = run_lockstep(ticks, state, table)
    return state.sums.loss, _grads(ops, state.sums, stage)


def _stage_ops(cfg, sh, params, batch_rs1, keys_r, sched, modes, stage, router) -> StageOps:
    """The constants of one step's ticks: the microbatches, the weights as loop constants
    (compute-dtype copies made once a step; GEMM weights as (compute copy, float32 master)
    pairs, so that their gradients come out of the GEMM in float32), the stash strategies."""
    mc, dtype, manual = cfg.model, M.DTYPES[cfg.compute_dtype], tuple(sh.manual)
    m, v, lmax = sched.m, sched.v, max(chunk_layers(cfg))
    b, s = batch_rs1.shape[0] // m, batch_rs1.shape[1] - 1     # a device's rows: its chunks
    tokens = batch_rs1.reshape((m, b, s + 1))
    keys = None if keys_r is None else keys_r.reshape((m, b))
    eos, starts = D.document_end(cfg), None
    if eos is not None:
        starts = sh.document_starts(tokens[:, :, :-1].reshape(m * b, s), eos).reshape(m, b, s)
    w = M.cast(params, dtype)
    dense, specs = M.dense_weight_names(mc), M.gemm_specs(mc)

    def gemm_weight(k, a):       # fp8: rounded here, once a step (fp8.Prequantized)
        return F8.prequantize(a, specs[k]) if sh.fp8 else a

    def layer_weights(j, l):
        return {k: MasterGrad(gemm_weight(k, a[0, j, l]), params["layers"][k][0, j, l])
                if k in dense else a[0, j, l] for k, a in w["layers"].items()}
    weights = [[layer_weights(j, l) for l in range(lmax)] for j in range(v)]
    # offload: selective's layers run; the host stash moves the leaves offload's would move
    layer = M.layer_fn(mc, sh, cfg.remat.replace("offload", "selective"))
    pipe_head = None
    if spread_over_pipe(cfg):
        slices = VocabSlices(cfg)
        pipe_head = PipeHead(cfg, sh, slices,
                             slices.take({"embed": w["embed"], "head": w["head"]}, stage),
                             stage, sched.stage_of(sched.last_chunk))
    split = WholeBackward()
    if sched.has_weight_ops:
        split = SplitBackward(dense, _gemm_shapes(mc, sh, weights[0][0], dense, b, s, dtype),
                              dtype, manual, sh.fp8,
                              stash_store(modes.static_stash, "wstash_slot"))
    ops = StageOps(mc, sh, manual, dtype, tokens, keys, params, w, weights, layer,
                   stash_store(modes.static_stash, "stash_slot"), split, router.send_field,
                   pipe_head, starts=starts)
    if cfg.recompute != "offload":
        return ops
    offloaded = _residual_avals(replace(ops, layer=M.layer_fn(mc, sh, cfg.remat),
                                        res=Residuals()), b, s)
    kept = _residual_avals(replace(ops, res=Residuals()), b, s)
    return replace(ops, host=HostStash(host_leaves(kept, offloaded), kept, lmax))


def _residual_avals(ops: StageOps, b: int, s: int) -> list:
    """A layer's residual leaves, from one abstract trace made like the real ones (varying
    input, traced layer index and microbatch), so that it yields the same structure."""
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    x = jax.ShapeDtypeStruct((b, s, ops.mc.hidden_size), ops.dtype)
    return tuple(jax.make_jaxpr(lambda x_, i, mb: ops.layer_fwd(
        ops.weights[0][0], vary(x_, ops.manual), i, mb)[1])(x, i32, i32).out_avals)


def _gemm_shapes(mc, sh, wl, dense, b, s, dtype) -> dict:
    """{GEMM weight: (x shape, dy shape)} of one layer, from one recording trace."""
    shapes = {}
    plain = M.layer_fn(mc, sh)          # no jax.checkpoint around the probes
    jax.eval_shape(lambda x: plain({k: Probe(a.w, k, shapes) if k in dense else a
                                    for k, a in wl.items()}, x, 0, None),
                   jax.ShapeDtypeStruct((b, s, mc.hidden_size), dtype))
    return shapes


# ----------------------------------------------------------------------------- the state

def _zeros(manual) -> Callable:
    return lambda shape, dt: vary(jnp.zeros(shape, dt), manual)


def _uninitialised(manual) -> Callable:
    """Buffers the table writes before every read of them: uninitialised (`empty_buffer`).
    Only where 'tensor' is 1: XLA's partitioner knows a zero broadcast's sharding from its
    users, but gives an AllocateBuffer the whole shape and slices it (a CPU compile of a
    (1,2,2) zb-phased step: 264 dynamic-slices more)."""
    return lambda shape, dt: vary(empty_buffer(shape, dt), manual)


def initial_state(ops: StageOps, sched, alloc: Callable, b: int, mc) -> PipeState:
    """The carry before the first tick. Only the sums start at zero; every other buffer is
    written before it is read (the schedule's slots; an idle stage's arrivals go to the
    trash rows), so it comes from `alloc`."""
    s, h, dtype, manual = ops.tokens.shape[2] - 1, mc.hidden_size, ops.dtype, ops.manual
    lmax = len(ops.weights[0])
    residuals = _residual_avals(ops, b, s)
    msg = lambda: alloc((b, s, h), dtype)
    zeros = _zeros(manual)
    f32 = lambda t: jax.tree.map(lambda a: zeros(a.shape, jnp.float32), t)
    inbox = Inbox(alloc((sched.num_fwd_slots + 1, b, s, h), dtype),
                  alloc((sched.num_bwd_slots + 1, b, s, h), dtype))
    wire = Wire(msg(), msg(), msg(), msg())
    mid, head_y = msg(), msg()
    transit = ()
    if ops.host is not None:        # the offloaded leaves: a host stash instead
        transit = ops.host.make(alloc, zeros, sched.num_stash_slots)
        residuals = ops.host.split(residuals)[0]
    stash = ops.stash.make(alloc, residuals, lmax, sched.num_stash_slots)
    layers = tuple(tuple(f32(grads_of(wl)) for wl in chunk) for chunk in ops.weights)
    wstash = ()
    if isinstance(ops.split, SplitBackward):
        wstash = ops.split.store.make(alloc, ops.split.wstash_entry(), lmax,
                                      sched.num_wstash_slots)
    vocab = {} if ops.pipe_head is None else ops.pipe_head.weights
    sums = Sums(layers, f32(ops.params["embed"]), f32(ops.params["head"]), f32(vocab),
                zeros((), jnp.float32))
    return PipeState(inbox, wire, mid, head_y, stash, wstash, sums, transit)


def _grads(ops: StageOps, sums: Sums, stage) -> dict:
    """The sums in the layout of the params: layers stacked (1, v, Lmax, ...); with the head
    over the pipe, this stage's vocabulary slice placed in full-size zeros."""
    g_layers = jax.tree.map(lambda *ls: jnp.stack(ls), *[jax.tree.map(
        lambda *x: jnp.stack(x), *chunk) for chunk in sums.layers])
    grads = {"embed": sums.embed, "layers": jax.tree.map(lambda a: a[None], g_layers),
             "head": sums.head}
    if ops.pipe_head is not None:
        placed = ops.pipe_head.slices.put(sums.vocab, stage)
        grads["embed"] = jax.tree.map(jnp.add, grads["embed"], placed["embed"])
        grads["head"] = placed["head"]
    return grads


# ----------------------------------------------------------------------------- one tick

BOTH = ("down", "up")


@dataclass(frozen=True)
class RowPlan:
    """How one loop runs its rows: the switch's branches (0 idle), the head after the op
    (a `Ticks` head step), the channels sent, and those whose arrival is filed after the op."""
    ops: list
    head: Callable          # (state, ctl) -> state
    sends: tuple = BOTH
    late: tuple = ()


class Ticks:
    """One tick of the table on this stage: receive, run op, commit, send. The head steps a
    plan picks from: `no_head`, `head_every_row`, `head_when_due` (the last two are `no_head`
    where the last chunk's forward branch runs the whole head)."""

    def __init__(self, ops: StageOps, router: Router, stage, slot_sizes: dict, branches: list):
        self.ops, self.router, self.stage = ops, router, stage
        self.slot_sizes, self.branches = slot_sizes, branches
        over_pipe = ops.pipe_head is not None
        self.head_every_row = self._head_every_row if over_pipe else no_head
        self.head_when_due = self._head_when_due if over_pipe else no_head

    def tick(self, plan: RowPlan, state: PipeState, row: dict):
        ctl = self.control(row)
        state = self.receive(state, ctl, tuple(ch for ch in BOTH if ch not in plan.late))
        state = self.run_op(state, ctl, plan)
        state = self.commit(state, ctl, plan)
        return self.send(state, plan), None

    def control(self, row: dict) -> TickControl:
        """This stage's column of a control row, slot -1 (none) sent to the trash row."""
        ctl = TickControl(**{k: a[self.stage] for k, a in row.items()})
        return ctl._replace(**{k: jnp.where(getattr(ctl, k) >= 0, getattr(ctl, k), n)
                               for k, n in self.slot_sizes.items()
                               if getattr(ctl, k) is not None})

    def receive(self, state: PipeState, ctl: TickControl, channels) -> PipeState:
        return state._replace(inbox=self.router.receive(state.inbox, state.wire, ctl, channels))

    def run_op(self, state: PipeState, ctl: TickControl, plan: RowPlan) -> PipeState:
        """The switch. Late arrivals bypass it (they are no operand of it), so the permute
        that brought them need not end before the op."""
        held = {f"recv_{ch}": getattr(state.wire, f"recv_{ch}") for ch in plan.late}
        state = state._replace(wire=state.wire._replace(**dict.fromkeys(held)))
        host = None
        if self.ops.host is not None:       # host buffers stay out of the switch
            transit, fetched = self.ops.host.move(state.transit, ctl)
            host = transit.host
            state = state._replace(transit=transit._replace(host=()))
        state = jax.lax.switch(ctl.branch, plan.ops, state, ctl)
        if host is not None:
            state = state._replace(transit=state.transit._replace(host=host, incoming=fetched))
        return state._replace(wire=state.wire._replace(**held)) if held else state

    def commit(self, state: PipeState, ctl: TickControl, plan: RowPlan) -> PipeState:
        """What the tick's op leaves to after the switch: the late arrivals, the head."""
        if plan.late:
            state = self.receive(state, ctl, plan.late)
        return plan.head(state, ctl)

    def send(self, state: PipeState, plan: RowPlan) -> PipeState:
        wire = self.router.send(state.wire, state.sums.loss, self.stage, plan.sends)
        return state._replace(wire=wire)

    def _head_every_row(self, state: PipeState, ctl: TickControl) -> PipeState:
        out = self.ops.head_over_pipe(_head_sums(state), state.head_y, ctl)
        return _with_head_sums(state, out)

    def _head_when_due(self, state: PipeState, ctl: TickControl) -> PipeState:
        """In a conditional on the row's head flag: one predicate on every stage, so the
        collectives inside are fine. Only what the head updates passes through it."""
        out = jax.lax.cond(ctl.head_tick == 1, self.ops.head_over_pipe,
                           lambda out_, head_y, ctl_: out_, _head_sums(state), state.head_y, ctl)
        return _with_head_sums(state, out)


def no_head(state: PipeState, ctl: TickControl) -> PipeState:
    return state


def _head_sums(state: PipeState) -> HeadSums:
    return HeadSums(state.sums.loss, state.sums.vocab, state.inbox.bwd)


def _with_head_sums(state: PipeState, out: HeadSums) -> PipeState:
    return state._replace(sums=state.sums._replace(loss=out.loss, vocab=out.vocab),
                          inbox=state.inbox._replace(bwd=out.bwd))


def _slot_sizes(sched) -> dict:
    """Per slot column of the control rows, its buffer's size: the index of its trash row."""
    F, B = sched.num_fwd_slots, sched.num_bwd_slots
    return {"stash_slot": sched.num_stash_slots, "wstash_slot": sched.num_wstash_slots,
            "fwd_in_slot": F, "fwd_recv_slot": F, "bwd_in_slot": B, "loss_ct_slot": B,
            "bwd_recv_slot": B, "fwd_recv_up_slot": F, "bwd_recv_down_slot": B,
            "host_store_slot": sched.num_stash_slots, "host_fetch_slot": sched.num_stash_slots}


# ----------------------------------------------------------------------------- the loops

def run_lockstep(ticks: Ticks, state: PipeState, table: dict) -> PipeState:
    """Every row alike: both channels, the head where due."""
    plan = RowPlan(ticks.branches, ticks.head_when_due)
    state, _ = jax.lax.scan(partial(ticks.tick, plan), state,
                            {k: jnp.asarray(a) for k, a in table.items()})
    return state


def run_phased(ticks: Ticks, state: PipeState, table: dict, sched, overlap_p2p: bool):
    """Warm-up (forward rows), steady (forward row, backward row) pairs, cool-down (backward
    rows); each loop's switch holds only its own rows' branches."""
    p, m, v = sched.p, sched.m, sched.v
    warm, fwd, bwd, cool = phased_parts(p, m, v)
    heads = np.asarray(head_pairs(p, m, v))
    assert (table["head_tick"][np.asarray(fwd, np.int64), 0] == heads).all() and not table[
        "head_tick"][np.asarray(list(warm) + list(bwd) + list(cool), np.int64)].any()
    (w_ops, w_rows), (f_ops, f_rows), (b_ops, b_rows), (c_ops, c_rows) = (
        _loop_rows(table, ticks.branches, part) for part in (warm, fwd, bwd, cool))
    forward_row = RowPlan(f_ops, ticks.head_every_row if heads.all() else ticks.head_when_due,
                          ("down",))
    backward_row = RowPlan(b_ops, no_head, ("up",), ("down",) if overlap_p2p else ())

    def pair(state: PipeState, rows):
        state, _ = ticks.tick(forward_row, state, rows[0])
        return ticks.tick(backward_row, state, rows[1])
    if len(warm):
        state, _ = jax.lax.scan(partial(ticks.tick, RowPlan(w_ops, no_head, ("down",))),
                                state, w_rows)
    state, _ = jax.lax.scan(pair, state, (f_rows, b_rows))
    if len(cool):
        state, _ = jax.lax.scan(partial(ticks.tick, RowPlan(c_ops, no_head, ("up",))),
                                state, c_rows)
    return state


def _loop_rows(table: dict, ops: list, idx: range):
    """Phased tables: the control rows idx (one part of the table, pipeline/phased.py) and the
    switch branches they use, renumbered (idle stays 0), so that each loop's switch holds only
    its own ops."""
    idx = np.asarray(idx, np.int64)
    used = sorted(set(np.unique(table["branch"][idx]).tolist()) | {0})
    local = np.zeros(len(ops), np.int32)
    local[used] = np.arange(len(used), dtype=np.int32)
    rows = {n: jnp.asarray(local[a[idx]] if n == "branch" else a[idx]) for n, a in table.items()}
    return [ops[i] for i in used], rows
