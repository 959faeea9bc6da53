"""The contract of the train step's gradient paths, and the microbatch loop they share.

A gradient path runs inside the train step's `shard_map` (manual over 'data' and 'pipe'),
once a step on each data-parallel replica (and pipeline stage):

    path(params, batch_rs1, keys_r) -> (loss_sum, grads)

    params     this replica's parameters as the state holds them, float32, in the stage
               layout (layers (1, v, Lmax, ...) on its stage; ZeRO: this replica's shards),
               varying over the manual axes
    batch_rs1  (B/d, s+1) int32, this replica's rows: m microbatches of B/(d m) rows, in order
               (`microbatches`)
    keys_r     (B/d,) dropout keys, one per row, or None (no dropout)
    loss_sum   () float32, the sum of the token losses of the m microbatches (not a mean)
    grads      float32 sums of the gradients over the same microbatches, the structure of
               params; still to be summed over 'data' (but for the leaves a path reduce-scatters
               itself, which it says) and, for the embedding and head, over 'pipe'

The step (step.py) picks one path per config and does the rest: the reduction over 'data' and
'pipe', the division by the global batch's tokens, the update. The paths:

    step._microbatch_grads          p = 1: local_grads.microbatch_grads, a scan over the
                                    microbatches whose carry is the sums
    zero.microbatch_grads           p = 1, ZeRO reducing inside the backward: `accumulate`
                                    (zero 1: all microbatches but the last, whose backward adds
                                    the sums before it reduce-scatters); sharded leaves come back
                                    reduce-scattered
    pipeline.executor.pipeline_grads  p > 1: the sums are the executor's carry (pipe_state.Sums),
                                    added to by the ticks' backward, W and head ops
"""
from __future__ import annotations

from typing import Callable, Protocol

import jax
import jax.numpy as jnp

from ptdp_jax.parallel.sharding import vary


class GradPath(Protocol):
    def __call__(self, params: dict, batch_rs1: jax.Array, keys_r) -> tuple[jax.Array, dict]:
        ...


def microbatches(batch_rs1, keys_r, m: int):
    """(tokens (m, b, s+1), keys (m, b) or None): the rows cut into m microbatches, in order."""
    b = batch_rs1.shape[0] // m
    mbs = batch_rs1.reshape((m, b) + batch_rs1.shape[1:])
    keys = None if keys_r is None else keys_r.reshape((m, b) + keys_r.shape[1:])
    return mbs, keys


def f32_zeros(tree, manual):
    """float32 zeros shaped like tree, varying over the manual axes: a start for the sums."""
    return jax.tree.map(lambda x: vary(jnp.zeros(x.shape, jnp.float32), manual), tree)


def accumulate(loss_and_grads: Callable, init, mbs, keys):
    """init plus the sum over the microbatches of loss_and_grads(tokens, key_rows) (its
    (loss, grads) added in init's float32), in one `lax.scan`."""
    def body(acc, xs):
        return jax.tree.map(lambda a, x: a + x.astype(a.dtype), acc, loss_and_grads(*xs)), None
    return jax.lax.scan(body, init, (mbs, keys))[0]
