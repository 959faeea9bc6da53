"""Context parallelism: one sequence split over the 'context' mesh axis (parallel.context = c).

Causal load balance: a sequence of s tokens is cut into 2c chunks of L = s / 2c; context rank i
holds chunks i and 2c - 1 - i, so every rank does the same attention work (chunk k attends to
k + 1 chunks of keys: i + 1 and 2c - i, 2c + 1 a rank). A rank's two chunks are two rows of
its activations, (2b, L, ...) for b sequences, rows ordered (sequence, chunk), so everything
that works token by token (the GEMMs, norms, the loss) runs unchanged on them; their positions
(`positions`) are what rotary and GPT's position embedding take, and attention gathers every
rank's keys and values (`attention`: an all-gather of the key/value heads only; then each
chunk's queries attend, in two flash-attention parts merged by their log-sum-exp, the keys of
the chunks before it and, causally, their own chunk's).

    rows = local_rows(tokens_bs1, c, rank)     # (2b, L + 1): this rank's chunks, + next token
    pos = positions(c, rank, L, 2b)            # (2b, L) int32
    o = attention(q, k, v, c, rank, scale, kernel="cudnn")   # in a region manual over 'context'

Document masking (data.document_mask): `document_starts` gives each token the position where its
document begins, and attention's keys are those at or after it, too.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from ptdp_jax.parallel import flash as F
from ptdp_jax.parallel.manual import vary, varying_axes

AXIS = "context"


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


def attention(q_rnd, k_rnd, v_rnd, c: int, rank, scale: float, starts_rs=None,
              kernel: str = "tiled"):
    """Causal attention of this rank's rows (2b, L, heads, d) over the keys of every rank
    (all-gathered over 'context', the key/value heads only): each query sees the keys at or
    before its position (and, given `starts_rs`, at or after its document's start). Returns
    (2b, L, heads, d). A chunk's queries attend in two parts (flash.py's `kernel`): the
    chunks before theirs, whole, and their own, causally. The backward gathers the keys and
    values again (a layer keeps only its own chunks) and reduce-scatters their gradients."""
    return _context_attention(q_rnd, k_rnd, v_rnd, starts_rs, rank, c, scale, kernel)


def _gather(x_rnd, c):
    return natural_order(jax.lax.all_gather(x_rnd, AXIS, axis=0, tiled=False), c)


def _scatter(dx_bsnd, c):
    """The transpose of _gather: each rank's rows of the gradient, summed over the ranks."""
    return jax.lax.psum_scatter(chunk_order(dx_bsnd, c), AXIS, scatter_dimension=0,
                                tiled=False)


def _parts(k, v, starts, rank, c: int, j: int, L: int):
    """Row j's two parts, (keys, values, Part) of the chunks before its chunk (a length of at
    least 1) and of its own chunk (causal), then whether any chunk comes before (else the
    first part counts for nothing) and where its chunk starts."""
    b = k.shape[0]
    first = chunk_of(rank, j, c) * L
    length = jnp.full((b,), jnp.maximum(first, 1), jnp.int32)
    own = lambda x: jax.lax.dynamic_slice_in_dim(x, first, L, axis=1)
    start = None if starts is None else starts[:, j]
    own_start = None if start is None else jnp.maximum(start - first, 0)
    return ((k, v, F.Part(False, length, start)), (own(k), own(v), F.Part(True, None, own_start)),
            first > 0, first)


def _rows(x, j):
    """Row j (0 or 1) of each sequence: (2b, ...) -> (b, ...)."""
    return x.reshape((x.shape[0] // 2, 2) + x.shape[1:])[:, j]


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6, 7))
def _context_attention(q, k, v, starts, rank, c, scale, kernel):
    return _context_fwd(q, k, v, starts, rank, c, scale, kernel)[0]


def _context_fwd(q, k, v, starts, rank, c, scale, kernel):
    out, lse = local_forward(q, _gather(k, c), _gather(v, c), starts, rank, c, scale, kernel)
    out = F.name_kept(out)          # selective keeps them, as it keeps cuDNN's outputs
    return out, (q, k, v, starts, rank, out, F.name_kept(lse))


def _context_bwd(c, scale, kernel, res, g):
    q, k, v, starts, rank, out, lse = res
    dq, dk, dv = local_backward(q, _gather(k, c), _gather(v, c), starts, rank, c, scale, kernel,
                                out, lse, g)
    return dq, _scatter(dk.astype(k.dtype), c), _scatter(dv.astype(v.dtype), c), None, None


def local_forward(q, k_bsnd, v_bsnd, starts, rank, c: int, scale: float, kernel: str):
    """One rank's part of `attention` once the keys and values are gathered (b, s, kv, d):
    (out like q, lse (b, 2, n, L) float32)."""
    L = q.shape[1]
    st = None if starts is None else starts.reshape(starts.shape[0] // 2, 2, L)
    outs, lses = [], []
    for j in (0, 1):
        (k0, v0, before), (k1, v1, own), has, _ = _parts(k_bsnd, v_bsnd, st, rank, c, j, L)
        o0, l0 = F.forward(kernel, _rows(q, j), k0, v0, before, scale)
        o1, l1 = F.forward(kernel, _rows(q, j), k1, v1, own, scale)
        o, lse = F.merge([(o0, jnp.where(has, l0, -jnp.inf)), (o1, l1)])
        outs.append(o.astype(q.dtype))
        lses.append(lse)
    return jnp.stack(outs, axis=1).reshape(q.shape), jnp.stack(lses, axis=1)


def local_backward(q, k_bsnd, v_bsnd, starts, rank, c: int, scale: float, kernel: str, out,
                   lse, g):
    """The backward of `local_forward`: dq like q, and float32 dk, dv of the gathered keys and
    values (every rank's share of each)."""
    L = q.shape[1]
    st = None if starts is None else starts.reshape(starts.shape[0] // 2, 2, L)
    dk = dv = jnp.zeros(k_bsnd.shape, jnp.float32)
    dqs = []
    for j in (0, 1):
        (k0, v0, before), (k1, v1, own), has, first = _parts(k_bsnd, v_bsnd, st, rank, c, j, L)
        q_j, o_j, g_j = _rows(q, j), _rows(out, j), _rows(g, j)
        dq0, dk0, dv0 = F.backward(kernel, q_j, k0, v0, before, o_j, lse[:, j],
                                   jnp.where(has, g_j, jnp.zeros_like(g_j)), scale)
        dq1, dk1, dv1 = F.backward(kernel, q_j, k1, v1, own, o_j, lse[:, j], g_j, scale)
        dqs.append(dq0.astype(jnp.float32) + dq1)
        add = lambda full, part: jax.lax.dynamic_update_slice_in_dim(
            full, jax.lax.dynamic_slice_in_dim(full, first, L, axis=1) + part, first, 1)
        dk, dv = add(dk + dk0, dk1), add(dv + dv0, dv1)
    return jnp.stack(dqs, axis=1).reshape(q.shape).astype(q.dtype), dk, dv


_context_attention.defvjp(_context_fwd, _context_bwd)
