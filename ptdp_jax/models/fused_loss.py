"""The head's loss without (b, s, V) logits kept for the backward.

The gradient of a summed cross-entropy with respect to its logits (softmax - one-hot) does not
depend on anything downstream but a scalar, so the head takes its gradients in the forward:
chunk by chunk along the sequence, the logits of one chunk are made, reduced to the chunk's
loss, and turned into the gradients of the head's inputs (the last layer's output, the final
norm, the output / tied embedding matrix) at once. The backward only scales those by the loss
cotangent. No logits and no float32 softmax outlive their chunk: the head's memory is one
chunk's logits (`chunk_bytes`), not 4 b s V bytes plus a bf16 copy, and nothing is recomputed.
Evaluation (no gradient) runs the chunks for the loss alone.
`fused_head_grads` is that forward alone, adding into float32 sums that a caller carries (the
train step's microbatch loop: no zeros to start from, no add after).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ptdp_jax.parallel.sharding import vary, varying_axes

CHUNK_BYTES = 1 << 30       # float32 logits of one chunk: 1 GiB (the f32 gradient accumulators
                            # of the head take a pass per chunk: fewer chunks, fewer passes)


def num_chunks(b: int, s: int, v: int, chunk_bytes: int | None = None) -> int:
    """The fewest chunks of the sequence (a divisor of s) whose float32 logits fit chunk_bytes
    (default CHUNK_BYTES)."""
    need = max(1, -(-b * s * v * 4 // (chunk_bytes or CHUNK_BYTES)))
    return next(n for n in range(min(need, s), s + 1) if s % n == 0)


def fused_head_loss(chunk_loss, embed_p, head_p, x_bsh, targets_bs, chunks: int):
    """Sum of token losses of the head, chunk_loss(embed_p, head_p, x_bch, targets_bc) per
    chunk of c = s / chunks positions; gradients taken in the forward (see the module doc).
    The chunks run in a `lax.scan`, so one chunk's logits are live at a time."""
    dtypes = jax.tree.map(lambda a: a.dtype, (embed_p, head_p, x_bsh))

    def loss_only(e, h, x, t):
        body = lambda loss, xt: (loss + chunk_loss(e, h, *xt), None)
        return _scan(body, _zeros((), e, h, x, t), _chunked(x, t, chunks))[0]

    def forward(e, h, x, t):
        acc = (_zeros((), e, h, x, t), *jax.tree.map(lambda a: _zeros(a.shape, a), (e, h)))
        (loss, g_e, g_h), g_x = fused_head_grads(chunk_loss, acc, e, h, x, t, chunks)
        return loss, (g_e, g_h, g_x)

    def backward(res, ct):
        grads = jax.tree.map(lambda g, dt: (g * ct).astype(dt), res, dtypes)
        return (*grads, None)

    f = jax.custom_vjp(loss_only)
    f.defvjp(forward, backward)
    return f(embed_p, head_p, x_bsh, targets_bs)


def fused_head_grads(chunk_loss, acc, embed_p, head_p, x_bsh, targets_bs, chunks: int):
    """((loss, embed grads, head grads), dx): acc, float32 (loss, embed_p-, head_p-shaped),
    plus the head's loss sum and gradients, each chunk's added to it as it is made (a caller
    that carries float32 sums passes them: no zeros to start from, no add after); dx, the
    gradient of x_bsh, in x_bsh's dtype. Chunks as `fused_head_loss`."""
    axes = tuple(sorted(_axes(embed_p, head_p, x_bsh, targets_bs)))
    acc = jax.tree.map(lambda a: vary(a, axes), acc)

    def body(acc, xt):
        l, (ge, gh, gx) = jax.value_and_grad(chunk_loss, argnums=(0, 1, 2))(embed_p, head_p, *xt)
        new = (l, *jax.tree.map(lambda g: g.astype(jnp.float32), (ge, gh)))
        return jax.tree.map(jnp.add, acc, new), gx
    acc, g_x = _scan(body, acc, _chunked(x_bsh, targets_bs, chunks))
    return acc, jnp.moveaxis(g_x, 0, 1).reshape(x_bsh.shape)


def _chunked(x_bsh, targets_bs, chunks: int):
    """(x, targets) as (n, b, c, ...): the sequence cut into n = chunks pieces of c positions."""
    b, s = targets_bs.shape
    split = lambda a: jnp.moveaxis(a.reshape((b, chunks, s // chunks) + a.shape[2:]), 1, 0)
    return split(x_bsh), split(targets_bs)


def _scan(body, carry, xs):
    """`lax.scan` over the chunks; one chunk: no loop."""
    if jax.tree.leaves(xs)[0].shape[0] == 1:
        carry, y = body(carry, jax.tree.map(lambda a: a[0], xs))
        return carry, None if y is None else y[None]
    return jax.lax.scan(body, carry, xs)


def _axes(*like) -> frozenset:
    return frozenset().union(*(varying_axes(a) for a in jax.tree.leaves(like)))


def _zeros(shape, *like):
    """float32 zeros varying over the manual mesh axes that `like` vary over (inside a
    shard_map the scan's carry must keep its type; no axis is named here)."""
    return vary(jnp.zeros(shape, jnp.float32), tuple(sorted(_axes(*like))))
