"""Context parallelism: one sequence split over the 'context' mesh axis (parallel.context = c).

Causal load balance: a sequence of s tokens is cut into 2c chunks of L = s / 2c; context rank i
holds chunks i and 2c - 1 - i, so every rank does the same attention work (chunk k attends to
k + 1 chunks of keys: i + 1 and 2c - i, 2c + 1 a rank). A rank's two chunks are two rows of
its activations, (2b, L, ...) for b sequences, rows ordered (sequence, chunk), so everything
that works token by token (the GEMMs, norms, the loss) runs unchanged on them; their positions
(`positions`) are what rotary and GPT's position embedding take, and attention gathers every
rank's keys and values (`attention`: an all-gather of the key/value heads only, then a
blockwise attention over the keys each query may see, by position).

    rows = local_rows(tokens_bs1, c, rank)     # (2b, L + 1): this rank's chunks, + next token
    pos = positions(c, rank, L, 2b)            # (2b, L) int32
    o = attention(q, k, v, c, rank, scale)     # inside a region manual over 'context'

Document masking (data.document_mask): `document_starts` gives each token the position where its
document begins, and attention's keys are those at or after it, too.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from ptdp_jax.parallel.manual import vary, varying_axes

AXIS = "context"
BLOCK = 512                      # query and key tile of the blockwise attention


def chunk_of(rank, j: int, c: int):
    """The chunk (0 .. 2c-1) that row j (0 or 1) of context rank `rank` holds."""
    return rank if j == 0 else 2 * c - 1 - rank


def local_rows(tokens_bs1, c: int, rank):
    """(b, s + 1) token rows -> this rank's two chunks of each, (2b, L + 1), each with the
    token after it (the chunk's last target)."""
    b, s1 = tokens_bs1.shape
    L = (s1 - 1) // (2 * c)
    out = [jax.lax.dynamic_slice_in_dim(tokens_bs1, chunk_of(rank, j, c) * L, L + 1, axis=1)
           for j in (0, 1)]
    return jnp.stack(out, axis=1).reshape(2 * b, L + 1)


def rows_of(tokens_bs1, c: int):
    """Inside a region manual over 'context': this rank's rows of a (b, s + 1) batch
    (`local_rows`); the batch itself with c = 1."""
    return tokens_bs1 if c == 1 else local_rows(tokens_bs1, c, jax.lax.axis_index(AXIS))


def sequence_max(value, like):
    """value's max over the context ranks where `like` (an array the value came from) is split
    over them (inside a region manual over 'context', c > 1); value itself elsewhere."""
    if AXIS not in varying_axes(like) or jax.lax.axis_size(AXIS) == 1:
        return value
    return vary(jax.lax.pmax(value, AXIS), (AXIS,))    # the type of what it came from


def positions(c: int, rank, L: int, rows: int):
    """(rows, L) int32: the positions in their sequence of this rank's rows' tokens."""
    starts = jnp.stack([chunk_of(rank, j, c) * L for j in (0, 1)]).astype(jnp.int32)
    starts = jnp.tile(starts, rows // 2)
    return starts[:, None] + jnp.arange(L, dtype=jnp.int32)[None, :]


def document_starts(tokens_rs, eos: int, c: int):
    """(rows, s) int32: where each token's document begins in its sequence (just after the last
    `eos` before it; 0 in the first document). c > 1: the rows of `rows_of`, inside a region
    manual over 'context' (each rank's chunks learn of the ends in earlier chunks)."""
    rows, L = tokens_rs.shape
    pos = (jnp.broadcast_to(jnp.arange(L, dtype=jnp.int32), (rows, L)) if c == 1
           else positions(c, jax.lax.axis_index(AXIS), L, rows))
    after = jax.lax.cummax(jnp.where(tokens_rs == eos, pos + 1, 0), axis=1)
    starts = jnp.concatenate([jnp.zeros((rows, 1), jnp.int32), after[:, :-1]], axis=1)
    if c == 1:
        return starts
    # each chunk's last start, gathered in sequence order (b, 2c); a chunk's rows start no
    # earlier than the largest of the chunks before it
    ends = natural_order(jax.lax.all_gather(after[:, -1:], AXIS), c)
    before = jnp.concatenate([jnp.zeros_like(ends[:, :1]),
                              jax.lax.cummax(ends, axis=1)[:, :-1]], axis=1)
    rank = jax.lax.axis_index(AXIS)
    mine = jnp.stack([before[:, chunk_of(rank, j, c)] for j in (0, 1)], axis=1).reshape(rows)
    return jnp.maximum(starts, mine[:, None])


def natural_order(x_rows, c: int):
    """Every rank's rows gathered, (c, 2b, L, ...) -> (b, s, ...): the chunks back in the
    order of the sequence."""
    c_, rows, L = x_rows.shape[:3]
    b = rows // 2
    x = x_rows.reshape((c, b, 2, L) + x_rows.shape[3:])
    chunks = [x[k, :, 0] if k < c else x[2 * c - 1 - k, :, 1] for k in range(2 * c)]
    return jnp.concatenate(chunks, axis=1)


def chunk_order(x_bs, c: int):
    """Inverse of natural_order: (b, s, ...) -> (c, 2b, L, ...), rank r's rows at [r]."""
    b, s = x_bs.shape[:2]
    L = s // (2 * c)
    chunks = x_bs.reshape((b, 2 * c, L) + x_bs.shape[2:])
    per_rank = [jnp.stack([chunks[:, r], chunks[:, 2 * c - 1 - r]], axis=1) for r in range(c)]
    return jnp.stack(per_rank).reshape((c, 2 * b, L) + x_bs.shape[2:])


def attention(q_rnd, k_rnd, v_rnd, c: int, rank, scale: float, starts_rs=None):
    """Causal attention of this rank's rows (2b, L, heads, d) over the keys of every rank
    (all-gathered over 'context', the key/value heads only): each query sees the keys at or
    before its position (and, given `starts_rs`, at or after its document's start). Returns
    (2b, L, heads, d). The backward gathers the keys and values again (a layer keeps only its
    own chunks) and reduce-scatters their gradients."""
    rows, L = q_rnd.shape[:2]
    pos_q = positions(c, rank, L, rows).reshape(rows // 2, 2 * L)
    if starts_rs is not None:
        starts_rs = starts_rs.reshape(rows // 2, 2 * L)
    return _context_attention(q_rnd, k_rnd, v_rnd, pos_q, starts_rs, c, scale)


def _gather(x_rnd, c):
    return natural_order(jax.lax.all_gather(x_rnd, AXIS, axis=0, tiled=False), c)


def _scatter(dx_bsnd, c):
    """The transpose of _gather: each rank's rows of the gradient, summed over the ranks."""
    return jax.lax.psum_scatter(chunk_order(dx_bsnd, c), AXIS, scatter_dimension=0,
                                tiled=False)


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def _context_attention(q, k, v, pos, start, c, scale):
    return _context_fwd(q, k, v, pos, start, c, scale)[0]


def _context_fwd(q, k, v, pos, start, c, scale):
    rows, L = q.shape[:2]
    q_b = q.reshape((rows // 2, 2 * L) + q.shape[2:])
    out, res = _forward(q_b, _gather(k, c), _gather(v, c), pos, start, scale)
    return out.reshape(q.shape), (q, k, v, pos, start) + res[-2:]


def _context_bwd(c, scale, res, g):
    q, k, v, pos, start, out_b, lse = res
    rows, L = q.shape[:2]
    q_b = q.reshape((rows // 2, 2 * L) + q.shape[2:])
    g_b = g.reshape(q_b.shape)
    dq, dk, dv, _, _ = _attention_bwd(
        scale, (q_b, _gather(k, c), _gather(v, c), pos, start, out_b, lse), g_b)
    return dq.reshape(q.shape), _scatter(dk, c), _scatter(dv, c), None, None


_context_attention.defvjp(_context_fwd, _context_bwd)


# ----------------------------------------------------------------------------- the attention

def blockwise_attention(q_bqnd, k_bsnd, v_bsnd, pos_bq, scale: float, start_bq=None):
    """softmax(q k^T scale, over the keys at positions <= the query's) v, tile by tile with
    an online softmax: no (q, s) score matrix. Keys are in position order (key j at position
    j); queries at any positions `pos_bq` (b, q); `start_bq`: the keys before a query's
    document start are not seen either (their tiles are skipped). Grouped-query heads: n a
    multiple of kv."""
    return _attention(q_bqnd, k_bsnd, v_bsnd, pos_bq, start_bq, scale)


def _tiles(n: int) -> int:
    return math.gcd(n, BLOCK)


def _like(x, *refs):
    """x marked varying over the manual axes the refs vary over (a loop's carry must keep
    one type)."""
    axes = frozenset().union(*(varying_axes(r) for r in refs))
    return vary(x, tuple(sorted(axes)))


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
    return _forward(q, k, v, pos, start, scale)


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
