"""Document-masked attention in cuDNN's packed layout: each document a segment of jax's cuDNN
attention given segment offsets (jax.nn.dot_product_attention takes none), so that no tile
across two documents runs. cuDNN sizes a call's statistics and its backward's workspace by
segments x length, so a call takes two documents of each row (PAIR) and a loop goes over the
most documents a row holds. flash.py's interface: (o, lse (b, n, q) float32), and each call's
backward from the merged o and lse, swapped into cuDNN's residuals.

    o, lse = forward(q, k, v, part, scale)       # part: flash.Part with document starts
    dq, dk, dv = backward(q, k, v, part, o, lse, g, scale)
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ptdp_jax.parallel.manual import vary_like as _like

PAIR = 2                         # segments a call (the fewest cuDNN's packed layout takes)


class Call(NamedTuple):
    """One call's segments: query and key offsets and lengths, (b, PAIR) int32, -1 where a
    row has no such segment; which segment each query (b, q) and key (b, s) is in, -1: none."""
    q_off: object
    q_len: object
    kv_off: object
    kv_len: object
    q_seg: object
    kv_seg: object


def segment_attention(q, k, v, call: Call, causal: bool, scale: float):
    """cuDNN over the call's segments: (o (b, q, n, d), only inside segments); its pullback
    keeps the softmax statistics as (valid segments in row order, n, q) float32, a segment's
    queries from row 0."""
    from jax._src.cudnn import fused_attention_stablehlo as fa
    end = jnp.full(call.q_off.shape[:1] + (1,), -1, jnp.int32)
    mask = fa.MaskType.PADDING_CAUSAL if causal else fa.MaskType.PADDING
    return fa.dot_product_attention(
        q, k, v, None, None, call.q_len, call.kv_len, jnp.concatenate([call.q_off, end], 1),
        jnp.concatenate([call.kv_off, end], 1), scale=scale, mask_type=mask)


def forward(q, k, v, part, scale: float):
    causal = part.causal
    o = jnp.zeros(q.shape, q.dtype)
    lse = jnp.full((q.shape[0], q.shape[2], q.shape[1]), -jnp.inf, jnp.float32)
    init = tuple(_like(x, q, k, v, part.start) for x in (o, lse))

    def one(call, carry):
        o_c, pull = jax.vjp(lambda *a: segment_attention(*a, call, causal, scale), q, k, v)
        stats = jax.tree.leaves(pull)[_stats_leaf(pull, q)]
        inside = call.q_seg >= 0
        return (jnp.where(inside[..., None, None], o_c, carry[0]),
                jnp.where(inside[:, None], _lse_of(stats, call), carry[1]))
    return _over_calls(part, k.shape[1], one, init)


def backward(q, k, v, part, o, lse, g, scale: float):
    causal = part.causal
    init = tuple(_like(jnp.zeros(x.shape, jnp.float32), q, k, v, g, part.start)
                 for x in (q, k, v))

    def one(call, carry):
        o_c, pull = jax.vjp(lambda *a: segment_attention(*a, call, causal, scale), q, k, v)
        leaves, treedef = jax.tree.flatten(pull)
        at = _stats_leaf(pull, q)
        leaves[at] = _stats_of(lse, call, leaves[at])
        leaves[[i for i, x in enumerate(leaves) if x is o_c][0]] = o.astype(o_c.dtype)
        grads = jax.tree.unflatten(treedef, leaves)(g.astype(o_c.dtype))
        keep = (call.q_seg, call.kv_seg, call.kv_seg)
        return tuple(jnp.where((s >= 0)[..., None, None], d.astype(jnp.float32), c)
                     for d, s, c in zip(grads, keep, carry))
    dq, dk, dv = _over_calls(part, k.shape[1], one, init)
    return dq.astype(q.dtype), dk, dv


def _over_calls(part, ns: int, one, init):
    """Fold `one(call, carry)` over the part's calls: the documents of its own queries in
    pairs (causal), or the one document that began before them (part.length: its first
    query's; the keys [start, length))."""
    if part.causal:
        call_of, n_calls = document_pairs(part.start)
        return jax.lax.fori_loop(0, n_calls, lambda i, c: one(call_of(i), c), init)
    call = earlier_document(part.start, part.length, ns)
    return jax.lax.cond(jnp.any(call.q_seg >= 0), lambda c: one(call, c), lambda c: c, init)


def document_pairs(start_bq):
    """Causal attention within documents of (b, q) starts (a query's document begins there;
    start[t] == t where one begins): (i -> the Call of each row's documents 2i and 2i + 1,
    the number of calls)."""
    b, nq = start_bq.shape
    t = jnp.arange(nq, dtype=jnp.int32)
    begins = start_bq == t[None]
    doc = jnp.cumsum(begins.astype(jnp.int32), axis=1) - 1              # (b, q) its index
    first = jnp.full((b, nq + PAIR + 1), nq, jnp.int32).at[
        jnp.arange(b)[:, None], doc].min(jnp.broadcast_to(t, (b, nq)))

    def call(i):
        off = jax.lax.dynamic_slice_in_dim(first, i * PAIR, PAIR + 1, axis=1)
        valid = off[:, :PAIR] < nq
        on = lambda x: jnp.where(valid, x, -1)
        seg = jnp.where(doc // PAIR == i, doc % PAIR, -1)
        begin, length = on(off[:, :PAIR]), on(off[:, 1:] - off[:, :PAIR])
        return Call(begin, length, begin, length, seg, seg)
    return call, (jnp.max(doc[:, -1]) + PAIR) // PAIR


def earlier_document(start_bq, length_b, ns: int):
    """The queries (b, q) whose document began before key `length` (its first query's): they
    see keys [start, length) of keys (b, ns) in one segment; later documents' queries none."""
    b, nq = start_bq.shape
    n_q = jnp.sum(start_bq < length_b[:, None], axis=1).astype(jnp.int32)
    valid = n_q > 0
    ds = start_bq[:, 0]
    none = jnp.full((b,), -1, jnp.int32)
    two = lambda x: jnp.stack([jnp.where(valid, x, -1), none], axis=1)
    q_seg = jnp.where(jnp.arange(nq)[None] < n_q[:, None], 0, -1)
    s = jnp.arange(ns)[None]
    kv_seg = jnp.where(valid[:, None] & (s >= ds[:, None]) & (s < length_b[:, None]), 0, -1)
    return Call(two(jnp.zeros((b,), jnp.int32)), two(n_q), two(ds), two(length_b - ds),
                q_seg.astype(jnp.int32), kv_seg.astype(jnp.int32))


def _stats_index(call):
    """(b, q) the statistics' row and column of each query (row 0 where it is in none): rows
    are the valid segments in row order, columns a segment's queries from 0."""
    valid = (call.q_len >= 0).reshape(-1)
    rows = (jnp.cumsum(valid.astype(jnp.int32)) - 1).reshape(call.q_len.shape)
    seg = jnp.maximum(call.q_seg, 0)
    row = jnp.take_along_axis(rows, seg, axis=1)
    col = jnp.arange(seg.shape[1])[None] - jnp.take_along_axis(call.q_off, seg, axis=1)
    inside = call.q_seg >= 0
    return jnp.where(inside, row, 0), jnp.where(inside, col, 0)


def _lse_of(stats, call):
    """cuDNN's statistics of a call -> (b, n, q) the queries' log-sum-exp (-inf outside)."""
    row, col = _stats_index(call)
    lse = jnp.moveaxis(stats[row, :, col], -1, 1)                       # (b, n, q)
    return jnp.where((call.q_seg >= 0)[:, None], lse, -jnp.inf)


def _stats_of(lse_bnq, call, like):
    """The inverse of _lse_of: the queries' (merged) log-sum-exp laid out as cuDNN's."""
    row, col = _stats_index(call)
    row = jnp.where(call.q_seg >= 0, row, like.shape[0])                 # outside: dropped
    return jnp.zeros(like.shape, like.dtype).at[row, :, col].set(
        jnp.moveaxis(lse_bnq, 1, -1), mode="drop")


def _stats_leaf(pull, q) -> int:
    b, nq, n, _ = q.shape
    found = [i for i, x in enumerate(jax.tree.leaves(pull))
             if x.dtype == jnp.float32 and x.shape == (b * PAIR, n, nq)]
    if len(found) != 1:
        raise RuntimeError("this jax's packed cuDNN attention keeps no single (segments, n, "
                           "q) float32 statistics residual")
    return found[0]


def available() -> bool:
    """Whether jax's cuDNN attention takes the packed layout here: on a GPU of compute
    capability 9.0 (Hopper) or later."""
    d = jax.devices()[0]
    cc = getattr(d, "compute_capability", None)
    return d.platform == "gpu" and cc is not None and float(cc) >= 9.0
