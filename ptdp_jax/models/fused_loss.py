"""The head's loss without (b, s, V) logits kept for the backward.

The gradient of a summed cross-entropy with respect to its logits (softmax - one-hot) does not
depend on anything downstream but a scalar, so the head takes its gradients in the forward:
chunk by chunk along the sequence, the logits of one chunk are made, reduced to the chunk's
loss, and turned into the gradients of the head's inputs (the last layer's output, the final
norm, the output / tied embedding matrix) at once. The backward only scales those by the loss
cotangent. No logits and no float32 softmax outlive their chunk: the head's memory is one
chunk's logits (`chunk_bytes`), not 4 b s V bytes plus a bf16 copy, and nothing is recomputed.
Evaluation (no gradient) runs the chunks for the loss alone.
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
    b, s = targets_bs.shape
    c = s // chunks
    dtypes = jax.tree.map(lambda a: a.dtype, (embed_p, head_p, x_bsh))
    split = lambda a: jnp.moveaxis(a.reshape((b, chunks, c) + a.shape[2:]), 1, 0)  # (n, b, c, ...)

    def zeros(shape, *like):
        """float32 zeros varying over the manual mesh axes that `like` vary over (inside a
        shard_map the scan's carry must keep its type; no axis is named here)."""
        axes = frozenset().union(*(varying_axes(a) for a in jax.tree.leaves(like)))
        return vary(jnp.zeros(shape, jnp.float32), tuple(sorted(axes)))

    def scan(body, carry, xs):       # one chunk: no loop
        if chunks == 1:
            carry, y = body(carry, jax.tree.map(lambda a: a[0], xs))
            return carry, None if y is None else y[None]
        return jax.lax.scan(body, carry, xs)

    def loss_only(e, h, x, t):
        body = lambda loss, xt: (loss + chunk_loss(e, h, *xt), None)
        return scan(body, zeros((), e, h, x, t), (split(x), split(t)))[0]

    def forward(e, h, x, t):
        def body(acc, xt):
            l, (ge, gh, gx) = jax.value_and_grad(chunk_loss, argnums=(0, 1, 2))(e, h, *xt)
            new = (l, *jax.tree.map(lambda g: g.astype(jnp.float32), (ge, gh)))
            return jax.tree.map(jnp.add, acc, new), gx
        acc = (zeros((), e, h, x, t), *jax.tree.map(lambda a: zeros(a.shape, a), (e, h)))
        (loss, g_e, g_h), g_x = scan(body, acc, (split(x), split(t)))
        return loss, (g_e, g_h, jnp.moveaxis(g_x, 0, 1).reshape(x.shape))

    def backward(res, ct):
        grads = jax.tree.map(lambda g, dt: (g * ct).astype(dt), res, dtypes)
        return (*grads, None)

    f = jax.custom_vjp(loss_only)
    f.defvjp(forward, backward)
    return f(embed_p, head_p, x_bsh, targets_bs)
