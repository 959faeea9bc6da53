"""The pipeline executor's scan carry (`PipeState`), typed by what each part holds: the
messages on the two channels (`Wire`), those received and kept by slot (`Inbox`), the residual
and W stashes, and the float32 sums the executor returns (`Sums`). Also how an uninitialised
buffer is made (`empty_buffer`) and the small float32 helpers. pipeline/executor.py builds and
runs it; its module docstring says how each buffer moves in a tick.

Shapes: (b, s, h) is one microbatch's activation; F, B, S, SW are the schedule's forward
receive, backward receive, stash and W stash slot counts (`Schedule.num_fwd_slots`, ...).
Buffers indexed by a slot have one more row, the trash row [size], which an idle stage's
arrivals and writes go to.
"""
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


class Inbox(NamedTuple):
    """Messages received, kept by slot until the op that uses them."""
    fwd: jax.Array          # (F+1, b, s, h) activations, by forward receive slot
    bwd: jax.Array          # (B+1, b, s, h) gradients received and loss cotangents, by slot


class Wire(NamedTuple):
    """The two channels (pipeline/routing.py): last tick's arrivals, this tick's sends."""
    recv_down: jax.Array    # (b, s, h) from stage s-1: an activation (ZB-V's second leg:
                            #   a gradient)
    recv_up: jax.Array      # (b, s, h) from stage s+1: a gradient (ZB-V's second leg and
                            #   turn: an activation)
    send_down: jax.Array    # (b, s, h) to stage s+1
    send_up: jax.Array      # (b, s, h) to stage s-1


class Sums(NamedTuple):
    """Float32 sums over this replica's microbatches: what the executor returns."""
    layers: tuple           # [v][Lmax] {name: (...)} layer gradients
    embed: dict             # embedding gradients
    head: dict              # head gradients
    vocab: dict             # gradients of this stage's vocabulary slice (head over the pipe;
                            #   {} otherwise)
    loss: jax.Array         # () loss sum


class PipeState(NamedTuple):
    """The scan carry, on one stage. The stash layouts are the stash strategy's
    (pipeline/stash.py): indexed [Lmax] (S+1, ...) per leaf, or static [S][Lmax] (...)."""
    inbox: Inbox
    wire: Wire
    mid: jax.Array          # (b, s, h) cotangent from a backward's upper half to its lower half
    head_y: jax.Array       # (b, s, h) the last chunk's output, for the head over the pipe
    stash: tuple            # forward residuals of each layer (without the weights), by slot
    wstash: tuple           # tables with W ops: {GEMM weight: (x, dy)} of each layer, from B
                            #   to W, by slot; () otherwise
    sums: Sums
    transit: tuple = ()     # train.recompute=offload: the host stash (host_stash.Transit)


def grads_of(tree):
    """Per weight the leaf that carries its gradient: the float32 master of a
    MasterGrad pair, the weight itself otherwise."""
    return {k: a.master if isinstance(a, MasterGrad) else a for k, a in tree.items()}


def f32_add(acc, g):
    return jax.tree.map(lambda a, x: a + x.astype(jnp.float32), acc, g)


def replace_at(tup: tuple, i: int, value) -> tuple:
    """tup with item i replaced."""
    return tup[:i] + (value,) + tup[i + 1:]
