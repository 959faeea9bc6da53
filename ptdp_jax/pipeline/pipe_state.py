"""The pipeline executor's scan carry (`PipeState`) and its small helpers: the buffers a tick
reads and writes, how an uninitialised buffer is made (`empty_buffer`), and the float32
gradient sums. pipeline/executor.py builds and runs it."""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from ptdp_jax.models.dense import MasterGrad


def empty_buffer(shape, dtype) -> jax.Array:
    """An uninitialised buffer for state that the table writes before it reads it (stash,
    W stash, receive and send buffers). On GPU `lax.empty` is XLA's AllocateBuffer: the loop
    takes the buffer as it is, where zeros cost a fill and a copy into the loop of every such
    buffer once a step (309 `memcpy128` a step in a 4x H100 trace, 2026-11-27). On CPU it is zeros.
    tests/test_uninitialised.py fills these with NaN and checks that no gradient changes."""
    make = getattr(jax.lax, "empty", None) or jnp.zeros     # zeros where JAX has no lax.empty
    return make(shape, dtype)


class PipeState(NamedTuple):
    """The scan carry. Receive buffers and the stash have a trash row at index [size]."""
    fwd_buf: jax.Array      # (TF+1, b, s, h) activations received, by slot
    bwd_buf: jax.Array      # (TB+1, b, s, h) gradients received and loss cotangents, by slot
    recv_down: jax.Array    # (b, s, h) last tick's arrival from stage s-1 (an activation;
                            #   ZB-V's second leg: a gradient)
    recv_up: jax.Array      # (b, s, h) last tick's arrival from stage s+1 (a gradient; ZB-V's
                            #   second leg and turn: an activation)
    send_down: jax.Array    # (b, s, h) this tick's message to stage s+1 (routing.py)
    send_up: jax.Array      # (b, s, h) this tick's message to stage s-1
    mid: jax.Array          # (b, s, h) cotangent between the two backward halves
    head_y: jax.Array       # (b, s, h) the last chunk's output, for the head of this tick
    stash: tuple            # [Lmax][leaf] (S+1, ...) forward residuals of layer l, by slot;
                            #   parallel.static_stash: [S][Lmax][leaf] (...), a buffer per slot
    wstash: tuple           # [Lmax] {GEMM weight: (x (SW+1, b, s, ...), dy (SW+1, b, s, ...))}
                            #   what W needs, from B (tables with W ops; empty otherwise);
                            #   parallel.static_stash: [SW][Lmax] {GEMM weight: (x, dy)}
    g_layers: tuple         # [v][Lmax] {name: float32 (...)} layer gradients
    g_embed: dict           # float32 embedding gradients
    g_head: dict            # float32 head gradients
    g_vocab: dict           # float32 gradients of this stage's vocabulary slice (head over pipe)
    loss: jax.Array         # () float32 loss sum


def _grads_of(tree):
    """Per weight the leaf that carries its gradient: the float32 master of a
    MasterGrad pair, the weight itself otherwise."""
    return {k: a.master if isinstance(a, MasterGrad) else a for k, a in tree.items()}


def _f32_add(acc, g):
    return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, g)


def _set(tup: tuple, i: int, value) -> tuple:
    """tup with item i replaced."""
    return tup[:i] + (value,) + tup[i + 1:]
