"""One executor for any schedule table: a `lax.scan` over ticks inside the
train step's `shard_map`, which is manual over 'pipe' and 'data' ('tensor' stays
automatic, so tensor parallelism still comes from the sharding annotations).

Each tick, every stage reads its row of the table and runs one op under
`lax.switch` (so idle ticks cost nothing), then activations move one stage
forward and gradients one stage back with `ppermute` (outside the switch):

    op 0  idle
    op 1  forward of (microbatch, chunk): embed first if chunk 0; on the last chunk
          also the head + loss and its gradient, which seeds that chunk's backward
    op 2  backward, upper half of the chunk's layers (keeps the mid cotangent)
    op 3  backward, lower half (sends the input gradient upstream; chunk 0:
          into the embedding)
    op 4  backward of the whole chunk (chunks of a single layer)

Backward uses `jax.vjp` per microbatch. Its residuals live in a stash of
`schedule.num_stash_slots` slots (the schedule's in-flight bound, not m);
residuals that are the chunk's own weights are not copied into the stash but
taken from the weights again at backward time. Gradients accumulate in float32.
"""
from __future__ import annotations


import jax
import jax.numpy as jnp

from ptdp_jax.models import model as M
from ptdp_jax.pipeline.schedule import build_schedule
from ptdp_jax.sharding import vary

MSG = ("batch", "seq", "embed")            # stage-to-stage message (b, s, h)
MSG_SCATTERED = ("batch", "seq", "embed_sg")  # the same, split over 'tensor' (scatter/gather)


def schedule_for(cfg):
    p, v = cfg.parallel.pipe, cfg.parallel.virtual_stages
    layers_per_chunk = cfg.model.num_layers // (p * v)
    return build_schedule(cfg.parallel.schedule, p, cfg.num_microbatches, v,
                          split_backward=layers_per_chunk >= 2)


class _Residuals:
    """Flattens a jax.vjp pullback into (stashable leaves, leaves taken from the weights)."""

    def __init__(self):
        self.treedef = None
        self.from_weights = None     # per leaf: index into the weight leaves, or -1

    def split(self, pullback, weights):
        leaves, treedef = jax.tree.flatten(pullback)
        wids = {id(w): i for i, w in enumerate(jax.tree.leaves(weights))}
        from_weights = tuple(wids.get(id(l), -1) for l in leaves)
        if self.treedef is None:
            self.treedef, self.from_weights = treedef, from_weights
        # The pullback's static part (its jaxpr) is the same in every trace; only the leaves
        # (residuals) differ, so the first trace's treedef rebuilds any later one.
        assert from_weights == self.from_weights, "residual structure changed between traces"
        return [l for l, w in zip(leaves, from_weights) if w < 0]

    def join(self, stashed, weights):
        wl = jax.tree.leaves(weights)
        it = iter(stashed)
        leaves = [next(it) if w < 0 else wl[w] for w in self.from_weights]
        return jax.tree.unflatten(self.treedef, leaves)


def pipeline_grads(cfg, sh, params, batch_rs1, keys_r):
    """Loss sum and gradient sums of this data-parallel replica's microbatches.

    params: stage-local ('layers' (1, v, Lc, ...)), varying over 'pipe' and 'data'.
    batch_rs1: this replica's rows (B/d, s+1). Returns (loss_sum, grads) with
    the same structure as params; embed/head gradients still to be psum'd over 'pipe'."""
    from ptdp_jax.step import DTYPES
    sched = schedule_for(cfg)
    tab = {k: jnp.asarray(a) for k, a in sched.executor_arrays().items()}
    p, v, m = sched.p, sched.v, sched.m
    mc = cfg.model
    Lc = mc.num_layers // (p * v)
    n_lo = Lc // 2 if sched.split_backward else 0
    dtype = DTYPES[cfg.train.dtype]
    manual = tuple(sh.manual)
    stage = jax.lax.axis_index("pipe")
    sg = cfg.parallel.scatter_gather and cfg.parallel.tensor > 1

    b = batch_rs1.shape[0] // m
    s = mc.seq_len
    mbs = batch_rs1.reshape((m, b, s + 1))
    keys = None if keys_r is None else keys_r.reshape((m, b))

    # Compute-dtype copies of the weights (f32 master weights stay outside).
    w = M.cast(params, dtype)
    layers_w = jax.tree.map(lambda a: a[0], w["layers"])                   # (v, Lc, ...)

    def chunk_weights(j):
        cw = jax.tree.map(lambda a: a[j], layers_w)
        return (jax.tree.map(lambda a: a[:n_lo], cw), jax.tree.map(lambda a: a[n_lo:], cw))

    def key_rows(mb):
        return None if keys is None else keys[mb]

    def run(lw, x, first_layer, mb):
        return M.run_layers(mc, sh, lw, x, cfg.train.recompute, key_rows(mb), first_layer)

    def first_layer_of(j):
        return (j * p + stage) * Lc

    res_lo, res_hi = _Residuals(), _Residuals()

    def forward_pullbacks(j, mb, x):
        x = vary(x, manual)
        lo_w, hi_w = chunk_weights(j)
        l0 = first_layer_of(j)
        if n_lo:
            h, pull_lo = jax.vjp(lambda lw, x_: run(lw, x_, l0, mb), lo_w, x)
            lo = res_lo.split(pull_lo, lo_w)
        else:
            h, lo = x, []
        y, pull_hi = jax.vjp(lambda hw, h_: run(hw, h_, l0 + n_lo, mb), hi_w, h)
        return y, lo, res_hi.split(pull_hi, hi_w)

    # Structures of the stashed residuals, from one abstract trace.
    x_abs = jax.ShapeDtypeStruct((b, s, mc.hidden_size), dtype)
    _, lo_abs, hi_abs = jax.eval_shape(lambda x: forward_pullbacks(0, 0, x), x_abs)
    S = sched.num_stash_slots

    def zeros(shape, dt):
        return vary(jnp.zeros(shape, dt), manual)

    # The receive buffers and the stash have one extra "trash" row (index = their size):
    # a message nobody will read lands there, and an idle stage's slot points there.
    # State is updated with one slice update (under a cond on the op for the stash and
    # the gradients), never by selecting whole buffers, so idle ticks cannot put NaN or
    # Inf anywhere that is read.
    TF, TB, TS = sched.num_fwd_slots, sched.num_bwd_slots, S
    msg0 = zeros((b, s, mc.hidden_size), dtype)
    f32 = lambda t: jax.tree.map(lambda a: zeros(a.shape, jnp.float32), t)
    g_lo_shape = jax.tree.map(lambda a: a[:, :n_lo], layers_w)      # (v, Lc/2, ...)
    g_hi_shape = jax.tree.map(lambda a: a[:, n_lo:], layers_w)
    carry = {
        "fwd_buf": zeros((TF + 1, b, s, mc.hidden_size), dtype),
        "bwd_buf": zeros((TB + 1, b, s, mc.hidden_size), dtype),
        "stash_lo": [zeros((TS + 1,) + a.shape, a.dtype) for a in lo_abs],
        "stash_hi": [zeros((TS + 1,) + a.shape, a.dtype) for a in hi_abs],
        "mid": msg0, "recv_fwd": msg0, "recv_bwd": msg0,
        "g_lo": f32(g_lo_shape), "g_hi": f32(g_hi_shape),
        "g_embed": f32(w["embed"]), "g_head": f32(w["head"]),
        "loss": zeros((), jnp.float32),
    }
    # What an op that produces no gradient / residuals returns (compute dtype: the
    # float32 accumulation happens only on backward ticks).
    g_lo0 = jax.tree.map(lambda a: zeros(a.shape[1:], dtype), g_lo_shape)
    g_hi0 = jax.tree.map(lambda a: zeros(a.shape[1:], dtype), g_hi_shape)
    lo0 = [zeros(a.shape, a.dtype) for a in lo_abs]
    hi0 = [zeros(a.shape, a.dtype) for a in hi_abs]

    def embed_fn(e, mb):
        return M.embed(mc, sh, e, mbs[mb, :, :-1], key_rows(mb))

    # ------------------------------------------------------------------ the ops
    # Pure computations on this tick's operands (chunk input x, incoming cotangent ct,
    # mid cotangent; the stash is read, never written, inside). Outputs: y (forward
    # output), dx (input gradient), mid, residuals to stash, gradients of the two halves.
    def outputs(y=None, dx=None, mid=None, lo=None, hi=None, g_lo=None, g_hi=None, ins=None):
        cast = lambda t: jax.tree.map(lambda g: g.astype(dtype), t)
        return {"y": msg0 if y is None else y.astype(dtype),
                "dx": msg0 if dx is None else dx.astype(dtype),
                "mid": ins["mid"] if mid is None else mid.astype(dtype),
                "lo": lo0 if lo is None else lo, "hi": hi0 if hi is None else hi,
                "g_lo": g_lo0 if g_lo is None else cast(g_lo),
                "g_hi": g_hi0 if g_hi is None else cast(g_hi)}

    def op_idle(ins, r):
        return outputs(ins=ins)

    def op_forward(ins, r):
        x = jax.lax.cond(r["is_first"] == 1, lambda: embed_fn(w["embed"], r["mb"]), lambda: ins["x"])
        y, lo, hi = forward_pullbacks(r["vchunk"], r["mb"], x)
        # (some residuals are constants, e.g. empty placeholders: mark them per stage too)
        return outputs(y=y, lo=[vary(a, manual) for a in lo], hi=[vary(a, manual) for a in hi],
                       ins=ins)

    def upper(ins, r):
        _, hi_w = chunk_weights(r["vchunk"])
        stashed = [buf[ins["slot"]] for buf in ins["stash_hi"]]
        g_hi, ct_mid = res_hi.join(stashed, hi_w)(ins["ct"])
        return g_hi, ct_mid

    def lower(ins, r, mid):
        if not n_lo:
            return None, mid
        lo_w, _ = chunk_weights(r["vchunk"])
        stashed = [buf[ins["slot"]] for buf in ins["stash_lo"]]
        return res_lo.join(stashed, lo_w)(mid)

    def op_upper(ins, r):
        g_hi, mid = upper(ins, r)
        return outputs(mid=mid, g_hi=g_hi, ins=ins)

    def op_lower(ins, r):
        g_lo, dx = lower(ins, r, ins["mid"])
        return outputs(dx=dx, g_lo=g_lo, ins=ins)

    def op_full(ins, r):
        g_hi, mid = upper(ins, r)
        g_lo, dx = lower(ins, r, mid.astype(dtype))
        return outputs(dx=dx, g_lo=g_lo, g_hi=g_hi, ins=ins)

    branches = (op_idle, op_forward, op_upper, op_lower, op_full)

    # The ends of the pipe, applied after the op to the accumulators alone.
    def head_update(acc, y, mb, slot):
        """Last chunk's forward: loss, its gradient (seeds this microbatch's backward),
        head and (tied) embedding gradients."""
        targets = mbs[mb, :, 1:]
        loss, (g_e, g_h, dy) = jax.value_and_grad(
            lambda e, hd, y_: M.head_loss(mc, sh, e, hd, y_, targets), argnums=(0, 1, 2))(
                w["embed"], w["head"], y)
        add = lambda t, g: jax.tree.map(lambda a, x: a + x.astype(jnp.float32), t, g)
        return {"loss": acc["loss"] + loss, "g_embed": add(acc["g_embed"], g_e),
                "g_head": add(acc["g_head"], g_h),
                "bwd_buf": acc["bwd_buf"].at[slot].set(dy.astype(dtype))}

    def embed_update(g_embed, dx, mb):
        """First chunk's backward: the input gradient flows into the embedding."""
        _, pull_e = jax.vjp(lambda e: embed_fn(e, mb), w["embed"])
        (g_e,) = pull_e(dx)
        return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), g_embed, g_e)

    # ------------------------------------------------------------------ one tick
    fwd_perm = [(i, (i + 1) % p) for i in range(p)] if v > 1 else [(i, i + 1) for i in range(p - 1)]
    bwd_perm = [(i, (i - 1) % p) for i in range(p)] if v > 1 else [(i + 1, i) for i in range(p - 1)]

    def pick(slot, trash):
        return jnp.where(slot >= 0, slot, trash)

    def move(msg, perm):
        if sg:   # scatter/gather: each tensor rank sends 1/t of the message, all-gather on arrival
            msg = sh.constrain(msg, MSG_SCATTERED)
            out = jax.lax.ppermute(msg, "pipe", perm)
            return sh.constrain(sh.constrain(out, MSG_SCATTERED), MSG)
        return jax.lax.ppermute(msg, "pipe", perm)

    def tick(c, t):
        r = {k: a[t, stage] for k, a in tab.items()}
        op, j, mb = r["op"], r["vchunk"], r["mb"]
        fwd_buf = c["fwd_buf"].at[pick(r["fwd_recv_slot"], TF)].set(c["recv_fwd"])
        bwd_buf = c["bwd_buf"].at[pick(r["bwd_recv_slot"], TB)].set(c["recv_bwd"])
        slot = pick(r["stash_slot"], TS)
        ins = {"x": fwd_buf[jnp.maximum(r["fwd_in_slot"], 0)],
               "ct": bwd_buf[jnp.maximum(r["bwd_in_slot"], 0)], "mid": c["mid"],
               "stash_lo": c["stash_lo"], "stash_hi": c["stash_hi"], "slot": slot}
        out = jax.lax.switch(op, branches, ins, r)

        # State updates, each under a cond on the op so other ticks leave the buffer alone.
        is_fwd = op == 1
        stash = jax.lax.cond(
            is_fwd, lambda st: jax.tree.map(lambda buf, a: buf.at[slot].set(a), st, (out["lo"], out["hi"])),
            lambda st: st, (c["stash_lo"], c["stash_hi"]))
        accumulate = lambda pred, acc, g: jax.lax.cond(
            pred, lambda a: jax.tree.map(lambda x, y: x.at[j].add(y.astype(jnp.float32)), a, g),
            lambda a: a, acc)
        c = dict(c, fwd_buf=fwd_buf, mid=out["mid"], stash_lo=stash[0], stash_hi=stash[1],
                 g_lo=accumulate((op == 3) | (op == 4), c["g_lo"], out["g_lo"]),
                 g_hi=accumulate((op == 2) | (op == 4), c["g_hi"], out["g_hi"]))
        acc = {"loss": c["loss"], "g_embed": c["g_embed"], "g_head": c["g_head"], "bwd_buf": bwd_buf}
        acc = jax.lax.cond(is_fwd & (r["is_last"] == 1),
                           lambda a: head_update(a, out["y"], mb, pick(r["loss_ct_slot"], TB)),
                           lambda a: a, acc)
        g_embed = jax.lax.cond(((op == 3) | (op == 4)) & (r["is_first"] == 1),
                               lambda g: embed_update(g, out["dx"], mb), lambda g: g, acc["g_embed"])
        c = dict(c, loss=acc["loss"], g_head=acc["g_head"], bwd_buf=acc["bwd_buf"], g_embed=g_embed,
                 recv_fwd=move(out["y"], fwd_perm), recv_bwd=move(out["dx"], bwd_perm))
        return c, None

    carry, _ = jax.lax.scan(tick, carry, jnp.arange(sched.num_ticks))
    g_layers = jax.tree.map(lambda lo, hi: jnp.concatenate([lo, hi], axis=1)[None],
                            carry["g_lo"], carry["g_hi"])
    grads = {"embed": carry["g_embed"], "layers": g_layers, "head": carry["g_head"]}
    return carry["loss"], grads
