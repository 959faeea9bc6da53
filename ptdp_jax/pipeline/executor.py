"""One executor for any schedule table: a `lax.scan` over ticks inside a
`shard_map` that is manual over 'pipe' ('tensor' stays automatic).

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

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.models import model as M
from ptdp_jax.pipeline.schedule import build_schedule

MSG = ("batch", "seq", "embed")            # stage-to-stage message (b, s, h)
MSG_SCATTERED = ("batch", "seq", "embed_sg")  # the same, split over 'tensor' (scatter/gather)


def schedule_for(cfg):
    p, v = cfg.parallel.pipe, cfg.parallel.virtual_stages
    layers_per_chunk = cfg.model.num_layers // (p * v)
    return build_schedule(cfg.parallel.schedule, p, cfg.num_microbatches, v,
                          split_backward=layers_per_chunk >= 2)


def _vary(x, axes):
    from ptdp_jax.step import vary
    return vary(x, axes)


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
        x = _vary(x, manual)
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
        return _vary(jnp.zeros(shape, dt), manual)

    msg0 = zeros((b, s, mc.hidden_size), dtype)
    f32 = lambda t: jax.tree.map(lambda a: zeros(a.shape, jnp.float32), t)
    carry = {
        "fwd_buf": zeros((sched.num_fwd_slots, b, s, mc.hidden_size), dtype),
        "bwd_buf": zeros((sched.num_bwd_slots, b, s, mc.hidden_size), dtype),
        "stash_lo": [zeros((S,) + a.shape, a.dtype) for a in lo_abs],
        "stash_hi": [zeros((S,) + a.shape, a.dtype) for a in hi_abs],
        "mid": msg0, "recv_fwd": msg0, "recv_bwd": msg0,
        "g_lo": f32(jax.tree.map(lambda a: a[:, :n_lo], layers_w)),
        "g_hi": f32(jax.tree.map(lambda a: a[:, n_lo:], layers_w)),
        "g_embed": f32(w["embed"]), "g_head": f32(w["head"]),
        "loss": zeros((), jnp.float32),
    }

    def acc(tree, j, g):
        return jax.tree.map(lambda a, x: a.at[j].add(x.astype(jnp.float32)), tree, g)

    def add(tree, g):
        return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), tree, g)

    def embed_fn(e, mb):
        return M.embed(mc, sh, e, mbs[mb, :, :-1], key_rows(mb))

    # ------------------------------------------------------------------ the ops
    def op_idle(c, r):
        return c, msg0, msg0

    def op_forward(c, r):
        j, mb = r["vchunk"], r["mb"]
        x = jax.lax.cond(r["is_first"] == 1, lambda: embed_fn(w["embed"], mb),
                         lambda: c["fwd_buf"][jnp.maximum(r["fwd_in_slot"], 0)])
        y, lo, hi = forward_pullbacks(j, mb, x)
        slot = r["stash_slot"]
        c = dict(c, stash_lo=[buf.at[slot].set(a) for buf, a in zip(c["stash_lo"], lo)],
                 stash_hi=[buf.at[slot].set(a) for buf, a in zip(c["stash_hi"], hi)])

        def last(c):
            targets = mbs[mb, :, 1:]
            loss, (g_e, g_h, dy) = jax.value_and_grad(
                lambda e, hd, y_: M.head_loss(mc, sh, e, hd, y_, targets), argnums=(0, 1, 2))(
                    w["embed"], w["head"], y)
            bwd_buf = c["bwd_buf"].at[jnp.maximum(r["loss_ct_slot"], 0)].set(dy.astype(dtype))
            return dict(c, loss=c["loss"] + loss, bwd_buf=bwd_buf,
                        g_embed=add(c["g_embed"], g_e), g_head=add(c["g_head"], g_h))

        c = jax.lax.cond(r["is_last"] == 1, last, lambda c: c, c)
        send = jnp.where(r["is_last"] == 1, jnp.zeros_like(y), y)
        return c, send, msg0

    def upper(c, r):
        j, slot = r["vchunk"], r["stash_slot"]
        _, hi_w = chunk_weights(j)
        pull = res_hi.join([buf[slot] for buf in c["stash_hi"]], hi_w)
        g_hi, ct_mid = pull(c["bwd_buf"][jnp.maximum(r["bwd_in_slot"], 0)])
        return dict(c, g_hi=acc(c["g_hi"], j, g_hi), mid=ct_mid.astype(dtype))

    def lower(c, r):
        j, slot, mb = r["vchunk"], r["stash_slot"], r["mb"]
        if n_lo:
            lo_w, _ = chunk_weights(j)
            pull = res_lo.join([buf[slot] for buf in c["stash_lo"]], lo_w)
            g_lo, dx = pull(c["mid"])
            c = dict(c, g_lo=acc(c["g_lo"], j, g_lo))
        else:
            dx = c["mid"]

        def into_embedding(c):
            _, pull_e = jax.vjp(lambda e: embed_fn(e, mb), w["embed"])
            (g_e,) = pull_e(dx.astype(dtype))
            return dict(c, g_embed=add(c["g_embed"], g_e))

        c = jax.lax.cond(r["is_first"] == 1, into_embedding, lambda c: c, c)
        send = jnp.where(r["is_first"] == 1, jnp.zeros_like(dx), dx).astype(dtype)
        return c, msg0, send

    def op_upper(c, r):
        return upper(c, r), msg0, msg0

    def op_full(c, r):
        return lower(upper(c, r), r)

    branches = (op_idle, op_forward, op_upper, lower, op_full)

    # ------------------------------------------------------------------ one tick
    fwd_perm = [(i, (i + 1) % p) for i in range(p)] if v > 1 else [(i, i + 1) for i in range(p - 1)]
    bwd_perm = [(i, (i - 1) % p) for i in range(p)] if v > 1 else [(i + 1, i) for i in range(p - 1)]

    def store(buf, slot, msg):
        return jnp.where(slot >= 0, buf.at[jnp.maximum(slot, 0)].set(msg), buf)

    def move(msg, perm):
        if sg:   # scatter/gather: each tensor rank sends 1/t of the message, all-gather on arrival
            msg = sh.constrain(msg, MSG_SCATTERED)
            out = jax.lax.ppermute(msg, "pipe", perm)
            return sh.constrain(sh.constrain(out, MSG_SCATTERED), MSG)
        return jax.lax.ppermute(msg, "pipe", perm)

    def tick(c, t):
        r = {k: a[t, stage] for k, a in tab.items()}
        c = dict(c, fwd_buf=store(c["fwd_buf"], r["fwd_recv_slot"], c["recv_fwd"]),
                 bwd_buf=store(c["bwd_buf"], r["bwd_recv_slot"], c["recv_bwd"]))
        c, send_f, send_b = jax.lax.switch(r["op"], branches, c, r)
        c = dict(c, recv_fwd=move(send_f, fwd_perm), recv_bwd=move(send_b, bwd_perm))
        return c, None

    carry, _ = jax.lax.scan(tick, carry, jnp.arange(sched.num_ticks))
    g_layers = jax.tree.map(lambda lo, hi: jnp.concatenate([lo, hi], axis=1)[None],
                            carry["g_lo"], carry["g_hi"])
    grads = {"embed": carry["g_embed"], "layers": g_layers, "head": carry["g_head"]}
    return carry["loss"], grads
