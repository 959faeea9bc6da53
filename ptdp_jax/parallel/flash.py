"""Attention in parts, as flash attention computes it: a part's output and each query's
log-sum-exp of its scores, so that parts over disjoint keys merge exactly (`merge`), and a
part's backward from the merged output and log-sum-exp (FlashAttention-2's backward needs no
more). Two kernels, one interface:

    o, lse = forward(kernel, q, k, v, part, scale)        # lse (b, heads, q) float32
    dq, dk, dv = backward(kernel, q, k, v, part, o, lse, g, scale)

"tiled": JAX on any backend, tile by tile with an online softmax (no (q, s) score matrix),
with document starts; "cudnn": cuDNN's flash attention (jax.nn.dot_product_attention), its
backward given the merged statistics in place of its own; with document starts, cuDNN's
packed layout (packed.py). Grouped-query heads: n a multiple of kv. `blockwise_attention` is
the tiled kernel's whole causal attention at any positions; `document_attention` cuDNN's
whole causal attention within documents.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptdp_jax.parallel import packed
from ptdp_jax.parallel.manual import vary_like

BLOCK = 512                      # query and key tile of the tiled kernel
KERNELS = ("tiled", "cudnn")


class Part(NamedTuple):
    """Which keys the queries see: causal (key i at or before query i; as many keys as
    queries) or, with `length` ((b,) int32), keys [0, length); `start` ((b, q) int32, tiled
    only): no key before it (document masking)."""
    causal: bool
    length: object = None
    start: object = None


def _documents(kernel: str, part: Part) -> bool:
    return kernel == "cudnn" and part.start is not None


def forward(kernel: str, q, k, v, part: Part, scale: float):
    """(o (b, q, n, d) in q's dtype, lse (b, n, q) float32) of the part's keys; a query that
    sees none of them has lse -inf."""
    if _documents(kernel, part):
        return packed.forward(q, k, v, part, scale)
    if kernel == "cudnn":
        o, pull = jax.vjp(_cudnn(part, scale), q, k, v)
        return o, jax.tree.leaves(pull)[_stats_leaf(pull, q, k, v, o)]
    out, res = _forward(q, k, v, _positions(q, part), part.start, scale)
    b, nq, n, _ = q.shape
    return out, res[-1].reshape(b, n, nq)


def backward(kernel: str, q, k, v, part: Part, o, lse, g, scale: float):
    """(dq, dk, dv) of this part of an attention whose whole output is `o` and log-sum-exp
    `lse` (every part's merged), for the output's gradient g."""
    if _documents(kernel, part):
        return packed.backward(q, k, v, part, o, lse, g, scale)
    if kernel == "cudnn":
        o_, pull = jax.vjp(_cudnn(part, scale), q, k, v)
        leaves, treedef = jax.tree.flatten(pull)
        leaves[_stats_leaf(pull, q, k, v, o_)] = lse
        leaves[[i for i, x in enumerate(leaves) if x is o_][0]] = o.astype(o_.dtype)
        return jax.tree.unflatten(treedef, leaves)(g.astype(o_.dtype))
    b, nq, n, _ = q.shape
    lse_ = lse.reshape(b, k.shape[2], n // k.shape[2], nq)
    return _attention_bwd(scale, (q, k, v, _positions(q, part), part.start, o, lse_), g)[:3]


def merge(parts):
    """[(o, lse)] of parts over disjoint keys -> (o, lse) over all of them (float32 o)."""
    lse = functools.reduce(jnp.logaddexp, [l for _, l in parts])
    safe = jnp.where(jnp.isfinite(lse), lse, 0.0)
    out = 0.0
    for o, l in parts:
        w = jnp.moveaxis(jnp.exp(l - safe), 1, 2)[..., None]          # (b, q, n, 1)
        out = out + jnp.where(w > 0, w * o.astype(jnp.float32), 0.0)
    return out, lse


def _cudnn(part: Part, scale: float):
    return lambda q, k, v: jax.nn.dot_product_attention(
        q, k, v, scale=scale, is_causal=part.causal, key_value_seq_lengths=part.length,
        implementation="cudnn")


def _stats_leaf(pull, q, k, v, o) -> int:
    """Where cuDNN's softmax statistics (the log-sum-exp, (b, n, q) float32) sit among its
    pullback's residuals."""
    b, nq, n, _ = q.shape
    known = {id(x) for x in (q, k, v, o)}
    found = [i for i, x in enumerate(jax.tree.leaves(pull)) if id(x) not in known
             and x.dtype == jnp.float32 and x.shape == (b, n, nq)]
    if len(found) != 1:
        raise RuntimeError("this jax's cuDNN attention keeps no single (b, n, q) float32 "
                           "statistics residual")
    return found[0]


def _positions(q, part: Part):
    """(b, q) the tiled kernel's query positions: key j is at position j."""
    b, nq = q.shape[:2]
    if part.causal:
        return jnp.broadcast_to(jnp.arange(nq, dtype=jnp.int32), (b, nq))
    return jnp.broadcast_to(part.length.astype(jnp.int32)[:, None] - 1, (b, nq))


def blockwise_attention(q_bqnd, k_bsnd, v_bsnd, pos_bq, scale: float, start_bq=None):
    """softmax(q k^T scale, over the keys at positions <= the query's) v, tile by tile with
    an online softmax: no (q, s) score matrix. Keys are in position order (key j at position
    j); queries at any positions `pos_bq` (b, q); `start_bq`: the keys before a query's
    document start are not seen either (their tiles are skipped)."""
    return _attention(q_bqnd, k_bsnd, v_bsnd, pos_bq, start_bq, scale)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def document_attention(q_bqnd, k_bsnd, v_bsnd, start_bq, scale: float):
    """Causal attention within documents (`start_bq` (b, q): where each query's document
    begins) in cuDNN's packed layout; its output and log-sum-exp are its residuals, named
    "attention" (selective recomputation keeps them)."""
    return forward("cudnn", q_bqnd, k_bsnd, v_bsnd, Part(True, None, start_bq), scale)[0]


def _document_fwd(q, k, v, start, scale):
    o, lse = forward("cudnn", q, k, v, Part(True, None, start), scale)
    o = name_kept(o)
    return o, (q, k, v, start, o, name_kept(lse))


def name_kept(x):
    """Named "attention": selective recomputation keeps it. A kernel's primal output is the
    named value itself, so that the out-projection's weight gradient reads the kept output
    instead of running the attention's forward again in the backward."""
    return checkpoint_name(x, "attention")


def _document_bwd(scale, res, g):
    q, k, v, start, o, lse = res
    dq, dk, dv = backward("cudnn", q, k, v, Part(True, None, start), o, lse, g, scale)
    return dq, dk.astype(k.dtype), dv.astype(v.dtype), None


document_attention.defvjp(_document_fwd, _document_bwd)


def _tiles(n: int) -> int:
    return math.gcd(n, BLOCK)


_like = vary_like


@functools.partial(jax.custom_vjp, nondiff_argnums=(5,))
def _attention(q, k, v, pos, start, scale):
    return _forward(q, k, v, pos, start, scale)[0]


def _grouped(q, k):
    b, nq, n, d = q.shape
    kv = k.shape[2]
    return q.reshape(b, nq, kv, n // kv, d)


def _key_tiles_for(pos_tile, start_tile, tk: int, s: int):
    """The key tiles (of tk) a query tile needs: from its earliest document start (0 without
    document masking) to its largest position."""
    first = 0 if start_tile is None else jnp.min(start_tile) // tk
    return first, jnp.minimum(jnp.max(pos_tile) // tk + 1, s // tk)


def _scores(q_t, k_t, pos_t, start_t, key0, scale):
    """(b, kv, g, tq, tk) float32 scores of a query tile against a key tile starting at
    position key0, the keys after each query's position (or before its document) masked."""
    s = jnp.einsum("bqkgd,bskd->bkgqs", q_t, k_t, preferred_element_type=jnp.float32) * scale
    key_pos = key0 + jnp.arange(k_t.shape[1])
    visible = key_pos[None, None, :] <= pos_t[:, :, None]             # (b, tq, tk)
    if start_t is not None:
        visible &= key_pos[None, None, :] >= start_t[:, :, None]
    return jnp.where(visible[:, None, None], s, -jnp.inf), visible


def _tile(x, i, t, axis=1):
    return None if x is None else jax.lax.dynamic_slice_in_dim(x, i * t, t, axis=axis)


def _forward(q, k, v, pos, start, scale):
    b, nq, n, d = q.shape
    s = k.shape[1]
    tq, tk = _tiles(nq), _tiles(s)
    qg = _grouped(q, k)

    def one_query_tile(i):
        q_t = jax.lax.dynamic_slice_in_dim(qg, i * tq, tq, axis=1)
        pos_t, start_t = _tile(pos, i, tq), _tile(start, i, tq)
        kv, g = qg.shape[2], qg.shape[3]
        m0 = jnp.full((b, kv, g, tq), -jnp.inf, jnp.float32)
        acc0 = tuple(_like(a, q, k, v, pos) for a in
                     (m0, jnp.zeros_like(m0), jnp.zeros((b, kv, g, tq, d), jnp.float32)))

        def body(j, acc):
            m, l, o = acc
            k_t = jax.lax.dynamic_slice_in_dim(k, j * tk, tk, axis=1)
            v_t = jax.lax.dynamic_slice_in_dim(v, j * tk, tk, axis=1)
            sc, _ = _scores(q_t, k_t, pos_t, start_t, j * tk, scale)
            m_new = jnp.maximum(m, sc.max(-1))
            safe = jnp.where(jnp.isfinite(m_new), m_new, 0.0)
            p = jnp.exp(sc - safe[..., None])
            fix = jnp.exp(jnp.where(jnp.isfinite(m), m - safe, -jnp.inf))
            o = o * fix[..., None] + jnp.einsum("bkgqs,bskd->bkgqd", p, v_t.astype(jnp.float32))
            return m_new, l * fix + p.sum(-1), o

        m, l, o = jax.lax.fori_loop(*_key_tiles_for(pos_t, start_t, tk, s), body, acc0)
        lse = m + jnp.log(l)
        return (o / l[..., None]), lse

    o, lse = jax.lax.map(one_query_tile, jnp.arange(nq // tq))       # (nt, b, kv, g, tq, ...)
    o = jnp.moveaxis(o, 0, 3).reshape(b, k.shape[2], n // k.shape[2], nq, d)
    lse = jnp.moveaxis(lse, 0, 3).reshape(b, k.shape[2], n // k.shape[2], nq)
    out = jnp.moveaxis(o, 3, 1).reshape(b, nq, n, d).astype(q.dtype)
    return out, (q, k, v, pos, start, out, lse)


def _attention_fwd(q, k, v, pos, start, scale):
    out, (*inputs, _, lse) = _forward(q, k, v, pos, start, scale)
    out = name_kept(out)             # the primal output is the kept one (name_kept)
    return out, (*inputs, out, name_kept(lse))


def _attention_bwd(scale, res, g):
    q, k, v, pos, start, out, lse = res
    b, nq, n, d = q.shape
    s, kvh = k.shape[1], k.shape[2]
    tq, tk = _tiles(nq), _tiles(s)
    qg, gg = _grouped(q, k), _grouped(g, k)
    og = _grouped(out, k)
    delta = jnp.einsum("bqkgd,bqkgd->bkgq", gg.astype(jnp.float32), og.astype(jnp.float32))

    def one_query_tile(i, grads):
        dk, dv = grads
        q_t = jax.lax.dynamic_slice_in_dim(qg, i * tq, tq, axis=1)
        g_t = jax.lax.dynamic_slice_in_dim(gg, i * tq, tq, axis=1).astype(jnp.float32)
        pos_t, start_t = _tile(pos, i, tq), _tile(start, i, tq)
        lse_t = jax.lax.dynamic_slice_in_dim(lse, i * tq, tq, axis=3)
        dl_t = jax.lax.dynamic_slice_in_dim(delta, i * tq, tq, axis=3)

        def body(j, acc):
            dq_t, dk, dv = acc
            k_t = jax.lax.dynamic_slice_in_dim(k, j * tk, tk, axis=1)
            v_t = jax.lax.dynamic_slice_in_dim(v, j * tk, tk, axis=1)
            sc, visible = _scores(q_t, k_t, pos_t, start_t, j * tk, scale)
            p = jnp.where(visible[:, None, None], jnp.exp(sc - lse_t[..., None]), 0.0)
            dv_t = jnp.einsum("bkgqs,bqkgd->bskd", p, g_t)
            dp = jnp.einsum("bqkgd,bskd->bkgqs", g_t, v_t.astype(jnp.float32))
            ds = p * (dp - dl_t[..., None]) * scale
            dq_t = dq_t + jnp.einsum("bkgqs,bskd->bqkgd", ds, k_t.astype(jnp.float32))
            dk_t = jnp.einsum("bkgqs,bqkgd->bskd", ds, q_t.astype(jnp.float32))
            add = lambda full, part: jax.lax.dynamic_update_slice_in_dim(
                full, jax.lax.dynamic_slice_in_dim(full, j * tk, tk, axis=1) + part, j * tk, 1)
            return dq_t, add(dk, dk_t), add(dv, dv_t)

        dq0 = _like(jnp.zeros(q_t.shape, jnp.float32), q, k, v, g)
        dq_t, dk, dv = jax.lax.fori_loop(*_key_tiles_for(pos_t, start_t, tk, s), body,
                                         (dq0, dk, dv))
        return (dk, dv), dq_t

    zeros = _like(jnp.zeros((b, s, kvh, d), jnp.float32), q, k, v, g)
    (dk, dv), dq = jax.lax.scan(lambda c_, i: one_query_tile(i, c_), (zeros, zeros),
                                jnp.arange(nq // tq))
    dq = jnp.moveaxis(dq, 0, 1).reshape(b, nq, n, d)
    return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None, None


_attention.defvjp(_attention_fwd, _attention_bwd)
