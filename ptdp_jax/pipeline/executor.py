"""One executor for any schedule table: a `lax.scan` over ticks inside the train step's
`shard_map`, which is manual over 'pipe' and 'data' ('tensor' stays automatic, so tensor
parallelism still comes from the sharding annotations).

Each tick, on every stage:

    receive   the messages of the last tick go into their receive slots
    run op    one `lax.switch` over the stage's branch (idle, a forward, a backward half of
              one model chunk, or for zero-bubble tables its B (input gradient) or W (weight
              gradient)); the branch updates the state it owns in place: the residual stash,
              the W stash, the gradient accumulators, the send buffers
    head      (when the last chunk ran a forward anywhere) every stage takes 1/p of the
              vocabulary for the loss and its gradient (pipeline/head.py)
    send      one `ppermute` down (stage s -> s+1) and one up (s -> s-1): activations down
              and gradients up, or for ZB-V's second leg the other way (pipeline/routing.py)

1f1b-phased and zb-phased tables run as three loops: the warm-up's forward rows, the steady
(forward row, backward row) pairs with the head unconditional after the forward row (every
such row holds a last-chunk forward; no conditional holding collectives, so no host round
trip per tick), and the cool-down's backward rows (pipeline/phased.py); a forward row sends
down only, a backward row up only. With v > 1 chunks a stage only every v-th group of p pairs
holds a head, which then runs in a conditional (one host round trip a forward row: loops of
their own for the pairs with and without a head tripled the compile). There is
one switch per tick and no other conditional but the head's: a buffer passes through exactly
one branch, which either leaves it alone (no copy) or updates one slot of it in place. Branches are
specialised per (op, virtual chunk, layer count, first / last chunk), so a chunk's layers
are unrolled with their weights as loop constants: no per-tick weight slicing, no scan
inside a tick. Backward uses `jax.vjp` per layer; its residuals live in a stash of
`schedule.num_stash_slots` slots (the schedule's in-flight bound, not m), without the weights:
with the static stash (decisions.static_stash) a buffer per slot and a branch
per (op, slot), so that the layers' kernels write and read the residuals in place; otherwise
one stacked buffer per residual, indexed by the tick's stash_slot.
Gradients accumulate in float32; the embedding gradient by scatter-add into its accumulator.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.models import model as M
from ptdp_jax.models.dense import MasterGrad, Probe, Taps, weight_grad
from ptdp_jax.models.residuals import Residuals
from ptdp_jax.pipeline import schedule as S
from ptdp_jax.pipeline.balance import chunk_layers
from ptdp_jax.pipeline.head import VocabSlices, head_over_pipe, spread_over_pipe
from ptdp_jax.pipeline.phased import head_pairs, phased_parts
from ptdp_jax.pipeline.pipe_state import PipeState, _f32_add, _grads_of, _set, empty_buffer
from ptdp_jax.pipeline.routing import (  # noqa: F401  (re-exported)
    MSG, MSG_SCATTERED, Branch, Router, TickControl, control_table)
from ptdp_jax import decisions as D
from ptdp_jax.sharding import vary


def schedule_for(cfg) -> S.Schedule:
    p, v = cfg.parallel.pipe, cfg.parallel.virtual_stages
    return S.build_schedule(cfg.parallel.schedule, p, cfg.num_microbatches, v,
                            split_backward=min(chunk_layers(cfg)) >= 2,
                            chunk_pools=cfg.stash_chunk_pools)


def _rows(ctl: dict, ops: list, idx: range):
    """Phased tables: the control rows idx (one part of the table, pipeline/phased.py) and the
    switch branches they use, renumbered (idle stays 0), so that each loop's switch holds only
    its own ops."""
    idx = np.asarray(idx, np.int64)
    used = sorted(set(np.unique(ctl["branch"][idx]).tolist()) | {0})
    local = np.zeros(len(ops), np.int32)
    local[used] = np.arange(len(used), dtype=np.int32)
    rows = {n: jnp.asarray(local[a[idx]] if n == "branch" else a[idx]) for n, a in ctl.items()}
    return [ops[i] for i in used], rows


# ----------------------------------------------------------------------------- the executor

def pipeline_grads(cfg, sh, params, batch_rs1, keys_r):
    """Loss sum and gradient sums of this data-parallel replica's microbatches.

    params: stage-local float32 ('layers' (1, v, Lmax, ...)), varying over 'pipe' and 'data'.
    batch_rs1: this replica's rows (B/d, s+1). Returns (loss_sum, grads) with the structure
    of params; embed/head gradients still to be psum'd over 'pipe'."""
    sched, counts = schedule_for(cfg), chunk_layers(cfg)
    static = cfg.static_stash_on
    branches, ctl = control_table(sched, counts, static_stash=static)
    p, v, m = sched.p, sched.v, sched.m
    mc, dtype, manual = cfg.model, M.DTYPES[cfg.compute_dtype], tuple(sh.manual)
    lmax = max(counts)
    stage = jax.lax.axis_index("pipe")
    router = Router(sched, sh, cfg.parallel.scatter_gather and cfg.parallel.tensor > 1)

    b, s, h = batch_rs1.shape[0] // m, mc.seq_len, mc.hidden_size
    mbs = batch_rs1.reshape((m, b, s + 1))
    keys = None if keys_r is None else keys_r.reshape((m, b))
    key_rows = (lambda mb: None) if keys is None else (lambda mb: keys[mb])

    # Loop constants, made once per step: compute-dtype weights, one dict per (chunk, layer);
    # GEMM weights as (compute copy, float32 master) pairs, so that their gradients come out
    # of the GEMM in float32 (layers.dense) and go straight into the accumulators.
    w = M.cast(params, dtype)
    dense = M.dense_weight_names(mc)

    def layer_weights(j, l):
        return {k: MasterGrad(a[0, j, l], params["layers"][k][0, j, l]) if k in dense
                else a[0, j, l] for k, a in w["layers"].items()}
    W = [[layer_weights(j, l) for l in range(lmax)] for j in range(v)]
    layer = M.layer_fn(mc, sh, cfg.remat)
    res = Residuals()            # layer pullbacks <-> stashable leaves (without the weights)
    spread = spread_over_pipe(cfg)          # the head over every stage (pipeline/head.py)
    slices = VocabSlices(cfg) if spread else None
    head_w = slices.take({"embed": w["embed"], "head": w["head"]}, stage) if spread else {}

    # Zero-bubble tables split a backward into B and W: the GEMMs' weights get zero taps whose
    # "gradients" are the GEMM inputs and output gradients (models/dense.py), which B stores
    # in the W stash and W turns into weight gradients. Shapes from one recording trace.
    zb = sched.has_weight_ops
    gemm_shapes = {}
    if zb:
        plain = M.layer_fn(mc, sh)          # no jax.checkpoint around the probes
        jax.eval_shape(lambda x: plain({k: Probe(a.w, k, gemm_shapes) if k in dense else a
                                        for k, a in W[0][0].items()}, x, 0, None),
                       jax.ShapeDtypeStruct((b, s, h), dtype))

    def vjp_weights(wl):
        """The weights a layer's vjp is taken against: with zero taps on zero-bubble tables."""
        if not zb:
            return wl
        return {k: Taps(a.w, *(vary(jnp.zeros(sh_, dtype), manual) for sh_ in gemm_shapes[k]))
                if k in dense else a for k, a in wl.items()}

    def layer_fwd(wl, x, idx, mb):
        wl = vjp_weights(wl)
        y, pull = jax.vjp(lambda w_, x_: layer(w_, x_, idx, key_rows(mb)), wl, x)
        return y, res.split(pull, wl)

    def zeros(shape, dt):
        return vary(jnp.zeros(shape, dt), manual)

    def empty(shape, dt):
        """A buffer the table writes before every read of it: uninitialised (`empty_buffer`)
        where 'tensor' is 1 (decisions.empty_buffers). With tensor parallelism zeros: XLA's
        partitioner knows a zero broadcast's sharding from its users, but gives an
        AllocateBuffer the whole shape and slices it (a CPU compile of a (1,2,2) zb-phased
        step: 264 dynamic-slices more)."""
        if not D.empty_buffers(cfg):
            return zeros(shape, dt)
        return vary(empty_buffer(shape, dt), manual)

    # Residual shapes from one abstract trace made like the real ones (varying input, traced
    # layer index and microbatch), so that it yields the same residual structure.
    i32 = jax.ShapeDtypeStruct((), jnp.int32)
    res_abs = jax.eval_shape(lambda x, i, mb: layer_fwd(W[0][0], vary(x, manual), i, mb)[1],
                             jax.ShapeDtypeStruct((b, s, h), dtype), i32, i32)
    TF, TB, TS = sched.num_fwd_slots, sched.num_bwd_slots, sched.num_stash_slots
    # Only the sums start at zero; every other buffer is written before it is read (the
    # schedule's slots; an idle stage's arrivals go to the trash rows).
    msg = lambda: empty((b, s, h), dtype)
    f32 = lambda t: jax.tree.map(lambda a: zeros(a.shape, jnp.float32), t)
    state = PipeState(
        fwd_buf=empty((TF + 1, b, s, h), dtype), bwd_buf=empty((TB + 1, b, s, h), dtype),
        recv_down=msg(), recv_up=msg(), send_down=msg(), send_up=msg(), mid=msg(),
        head_y=msg(),
        stash=(tuple(tuple(tuple(empty(a.shape, a.dtype) for a in res_abs) for _ in range(lmax))
                     for _ in range(TS)) if static else
               tuple(tuple(empty((TS + 1,) + a.shape, a.dtype) for a in res_abs)
                     for _ in range(lmax))),
        g_layers=tuple(tuple(f32(_grads_of(W[j][l])) for l in range(lmax)) for j in range(v)),
        wstash=(tuple(tuple({k: tuple(empty(sh_, dtype) for sh_ in gemm_shapes[k]) for k in dense}
                            for _ in range(lmax)) for _ in range(sched.num_wstash_slots))
                if zb and static else
                tuple({k: tuple(empty((sched.num_wstash_slots + 1,) + sh_, dtype)
                                for sh_ in gemm_shapes[k]) for k in dense} if zb else {}
                      for _ in range(lmax))),
        g_embed=f32(params["embed"]), g_head=f32(params["head"]), g_vocab=f32(head_w),
        loss=zeros((), jnp.float32))

    # ------------------------------------------------------------------ the stash
    # Dynamic: a (TS+1, ...) buffer per residual, the slot a tick-control value (the producer
    # writes a temporary that a dynamic-update-slice copies in, the consumers read a copy).
    # Static: a buffer per slot and the slot fixed in the branch, so the layer's kernels
    # write and read the residuals in place.
    def stash_put(stash, br, c, l, leaves):
        leaves = tuple(vary(a, manual) for a in leaves)
        if not static:
            return _set(stash, l, tuple(buf.at[c.stash_slot].set(a)
                                        for buf, a in zip(stash[l], leaves)))
        return _set(stash, br.stash_slot, _set(stash[br.stash_slot], l, leaves))

    def stash_get(stash, br, c, l):
        if not static:
            return [buf[c.stash_slot] for buf in stash[l]]
        return list(stash[br.stash_slot][l])

    # The W stash (tables with W ops), the same two ways: a B writes each GEMM's (x, dy) of
    # layer l, a W reads them.
    def wstash_put(wstash, br, c, l, xdy: dict):
        xdy = {k: tuple(vary(a, manual) for a in v_) for k, v_ in xdy.items()}
        if not static:
            return _set(wstash, l, {k: tuple(buf.at[c.wstash_slot].set(a)
                                             for buf, a in zip(wstash[l][k], xdy[k])) for k in xdy})
        return _set(wstash, br.wstash_slot, _set(wstash[br.wstash_slot], l, xdy))

    def wstash_get(wstash, br, c, l) -> dict:
        if not static:
            return {k: (xb[c.wstash_slot], gb[c.wstash_slot]) for k, (xb, gb) in wstash[l].items()}
        return wstash[br.wstash_slot][l]

    # ------------------------------------------------------------------ the ops
    def forward(br):
        def run(st: PipeState, c: TickControl) -> PipeState:
            if br.first:
                x = M.embed(mc, sh, w["embed"], mbs[c.mb, :, :-1], key_rows(c.mb))
            else:
                x = st.fwd_buf[c.fwd_in_slot]
            stash = st.stash
            for l in range(br.n_layers):
                x, leaves = layer_fwd(W[br.vchunk][l], x, c.first_layer + l, c.mb)
                stash = stash_put(stash, br, c, l, leaves)
            st = st._replace(stash=stash)
            if br.last:
                return st._replace(head_y=x.astype(dtype)) if spread else head(st, x, c)
            return st._replace(**{router.send_field(br): x.astype(dtype)})
        return run

    def backward(br, part):
        n = br.n_layers
        lo, hi = {S.BWD_UPPER: (n // 2, n), S.BWD_LOWER: (0, n // 2), S.BWD_FULL: (0, n),
                  S.BWD_INPUT: (0, n)}[part]

        def run(st: PipeState, c: TickControl) -> PipeState:
            ct = st.mid if part == S.BWD_LOWER else st.bwd_buf[c.bwd_in_slot]
            g, wstash = list(st.g_layers[br.vchunk]), st.wstash
            for l in reversed(range(lo, hi)):
                wl = vjp_weights(W[br.vchunk][l])
                pull = res.join(stash_get(st.stash, br, c, l), wl)
                g_w, ct = pull(ct)
                if part == S.BWD_INPUT:   # B: GEMM inputs and output gradients to the W stash
                    wstash = wstash_put(wstash, br, c, l, {k: g_w[k][1:] for k in dense})
                    g_w = {k: a for k, a in g_w.items() if k not in dense}
                elif zb:        # a whole backward in a table with W ops (zb-phased): W now
                    g_w = {k: weight_grad(*a[1:], fp8=sh.fp8) if k in dense else a for k, a in g_w.items()}
                g[l] = dict(g[l], **_f32_add({k: g[l][k] for k in g_w}, _grads_of(g_w)))
            layers = list(st.g_layers)
            layers[br.vchunk] = tuple(g)
            st = st._replace(g_layers=tuple(layers), wstash=wstash)
            if part == S.BWD_UPPER:
                return st._replace(mid=ct.astype(dtype))
            if br.first:
                return st._replace(g_embed=embed_grad(st.g_embed, ct, c.mb))
            return st._replace(**{router.send_field(br): ct.astype(dtype)})
        return run

    def head(st: PipeState, y, c: TickControl) -> PipeState:
        """Last chunk's forward: loss, its gradient (seeds this microbatch's backward),
        head and (tied) embedding gradients."""
        targets = mbs[c.mb, :, 1:]
        loss, (g_e, g_h, dy) = jax.value_and_grad(
            lambda e, hd, y_: M.head_loss(mc, sh, e, hd, y_, targets), argnums=(0, 1, 2))(
                w["embed"], w["head"], y)
        return st._replace(loss=st.loss + loss, g_embed=_f32_add(st.g_embed, g_e),
                           g_head=_f32_add(st.g_head, g_h),
                           bwd_buf=st.bwd_buf.at[c.loss_ct_slot].set(dy.astype(dtype)))

    def embed_grad(g_embed, dx, mb):
        """The input gradient of chunk 0 into the embedding, taken against the float32
        tables so that XLA scatter-adds it into the accumulator in place."""
        _, pull = jax.vjp(lambda e: M.embed(mc, sh, e, mbs[mb, :, :-1], key_rows(mb)),
                          params["embed"])
        (g,) = pull(dx.astype(jnp.float32))
        return jax.tree.map(jnp.add, g_embed, g)

    def head_spread(out: tuple, head_y, c: TickControl) -> tuple:
        """out = (loss (), g_vocab {float32}, bwd_buf (TB+1, b, s, h)), what the head updates.
        The head of this tick's last-chunk forward, every stage taking 1/p of the
        vocabulary; the loss is counted on the last chunk's stage (p - 1; ZB-V: 0), dy lands
        in its loss slot. It takes and returns only the state it updates, so that no other
        buffer passes through its conditional (where it has one)."""
        loss_sum, g_vocab, bwd_buf = out
        last = stage == sched.stage_of(sched.last_chunk)
        loss, g, dy = head_over_pipe(cfg, sh, head_w, slices, stage, head_y, last,
                                     mbs[c.head_mb, :, 1:])
        return (loss_sum + jnp.where(last, loss, 0.0), _f32_add(g_vocab, g),
                bwd_buf.at[c.loss_ct_slot].set(dy.astype(dtype)))

    def idle(st, c):
        return st

    def weight(br):
        def run(st: PipeState, c: TickControl) -> PipeState:
            """W: the weight gradients of a chunk's GEMMs, from the W stash, added to the
            float32 accumulators inside the GEMMs."""
            g = list(st.g_layers[br.vchunk])
            for l in range(br.n_layers):
                g[l] = dict(g[l], **{k: g[l][k] + weight_grad(x, dy, sh.fp8) for k, (x, dy)
                                     in wstash_get(st.wstash, br, c, l).items()})
            layers = list(st.g_layers)
            layers[br.vchunk] = tuple(g)
            return st._replace(g_layers=tuple(layers))
        return run

    ops = [idle] + [forward(br) if br.op == S.FWD else weight(br) if br.op == S.BWD_WEIGHT
                    else backward(br, br.op) for br in branches[1:]]

    # ------------------------------------------------------------------ one tick
    def trash_if_none(c: TickControl) -> TickControl:
        sizes = {"stash_slot": TS, "wstash_slot": sched.num_wstash_slots, "fwd_in_slot": TF,
                 "fwd_recv_slot": TF,
                 "bwd_in_slot": TB, "loss_ct_slot": TB, "bwd_recv_slot": TB,
                 "fwd_recv_up_slot": TF, "bwd_recv_down_slot": TB}
        return c._replace(**{k: jnp.where(getattr(c, k) >= 0, getattr(c, k), n)
                             for k, n in sizes.items() if getattr(c, k) is not None})

    def tick(st: PipeState, row, branch_ops=ops, head="cond", channels=("down", "up"),
             late=()):
        """One row. late: channels whose arrival is filed after the op (decisions.overlap_p2p:
        it bypasses the switch, so the permute that brought it need not end before the op)."""
        c = trash_if_none(TickControl(**{k: a[stage] for k, a in row.items()}))
        st = router.receive(st, c, tuple(ch for ch in ("down", "up") if ch not in late))
        held = {f"recv_{ch}": getattr(st, f"recv_{ch}") for ch in late}
        st = jax.lax.switch(c.branch, branch_ops, st._replace(**dict.fromkeys(held)), c)
        st = router.receive(st._replace(**held), c, late) if late else st
        if spread and head != "none":
            out = (st.loss, st.g_vocab, st.bwd_buf)
            if head == "cond":   # one predicate on every stage: collectives inside are fine
                out = jax.lax.cond(c.head_tick == 1, head_spread, lambda o, y, c_: o,
                                   out, st.head_y, c)
            else:                # "static": every row this loop runs has a head
                out = head_spread(out, st.head_y, c)
            st = st._replace(loss=out[0], g_vocab=out[1], bwd_buf=out[2])
        return router.send(st, stage, channels), None

    if sched.name in S.PHASED:   # warm-up, steady (forward, backward) pairs, cool-down
        warm, fwd, bwd, cool = phased_parts(p, m, v)
        heads = np.asarray(head_pairs(p, m, v))
        fwd, bwd = np.asarray(fwd, np.int64), np.asarray(bwd, np.int64)
        assert (ctl["head_tick"][fwd, 0] == heads).all() and not ctl["head_tick"][
            np.asarray(list(warm) + list(bwd) + list(cool), np.int64)].any()
        (w_ops, w_rows), (f_ops, f_rows), (b_ops, b_rows), (c_ops, c_rows) = (
            _rows(ctl, ops, part) for part in (warm, fwd, bwd, cool))

        # a forward row sends activations down only, a backward row gradients up only; the
        # head runs after every forward row at v = 1, and at v > 1 (where only the forward rows
        # whose last stage runs the last chunk have one) in a conditional
        # decisions.overlap_p2p: the forward row's message (used by the next forward row) is
        # filed after the backward row's op, so that its permute can run under that op
        late = ("down",) if D.overlap_p2p(cfg) else ()

        def pair(st: PipeState, rows):
            st, _ = tick(st, rows[0], f_ops, "static" if heads.all() else "cond", ("down",))
            return tick(st, rows[1], b_ops, "none", ("up",), late)
        if len(warm):
            state, _ = jax.lax.scan(lambda st, r: tick(st, r, w_ops, "none", ("down",)),
                                    state, w_rows)
        state, _ = jax.lax.scan(pair, state, (f_rows, b_rows))
        if len(cool):
            state, _ = jax.lax.scan(lambda st, r: tick(st, r, c_ops, "none", ("up",)),
                                    state, c_rows)
    else:
        state, _ = jax.lax.scan(tick, state, {k: jnp.asarray(a) for k, a in ctl.items()})
    g_layers = jax.tree.map(lambda *ls: jnp.stack(ls), *[jax.tree.map(
        lambda *x: jnp.stack(x), *state.g_layers[j]) for j in range(v)])
    grads = {"embed": state.g_embed, "layers": jax.tree.map(lambda a: a[None], g_layers),
             "head": state.g_head}
    if spread:
        placed = slices.put(state.g_vocab, stage)
        grads["embed"] = jax.tree.map(jnp.add, grads["embed"], placed["embed"])
        grads["head"] = placed["head"]
    return state.loss, grads
