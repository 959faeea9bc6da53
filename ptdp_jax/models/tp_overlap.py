"""Tensor-parallel GEMMs with sequence parallelism's collectives decomposed into rings of
permutes, each step's GEMMs independent of the permute in flight, so that the two can overlap
(a collective matmul: Wang et al., "Overlap Communication with Dependent Computation via
Decomposition", ASPLOS 2023; Megatron's --tp-comm-overlap), with
`parallel.sequence_parallel=true` where decisions.tp_comm_overlap says (`tuning.tp_comm_overlap`).

    gather_dense   AG(x) @ w_k for the column-parallel GEMMs that read one norm's output
                   (q, k, v; fc1; gate and up). Forward: x's blocks travel the ring while each
                   block's GEMMs run. Backward: the blocks travel again, for the weight
                   gradients (as Megatron gathers again), while the input gradients' partial
                   sums travel the other way (a reduce-scatter), each block's GEMMs in between.
    scatter_dense  RS(z @ w), a row-parallel GEMM (the attention's out projection; fc2 or
                   down). Forward: the partial sums travel while the next block's GEMM runs.
                   Backward: dy's blocks travel while each block's input- and weight-gradient
                   GEMMs run.

Each runs in a per-device region (`Sharder.per_device`: manual over the mesh axes GSPMD still
owns); the rings run over 'tensor'. The blocks are along the dim sequence parallelism splits: the rows, or the
sequence (`sharding.sequence_parallel_rows`). Weights are arrays (without pipelining, the only
place validation lets this run, the layers get no `dense.MasterGrad` or zero-bubble taps);
biases are added outside the region. The outputs are named "dense" as `dense.dense` names its own.
"""
from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptdp_jax.models.dense import _input_grad, weight_grad
from ptdp_jax.parallel.sharding import direct_gather, direct_scatter, vary, varying_axes

AXIS = "tensor"
# einsum letters of the layers' GEMM specs -> logical axes (layers.HEADS, FFN and the weights)
NAMES = {"b": "batch", "s": "seq", "h": "embed", "n": "heads", "d": "head_dim", "f": "mlp"}


def _names(letters: str) -> tuple[str, ...]:
    return tuple(NAMES[c] for c in letters)


def _parts(spec: str) -> tuple[str, str, str]:
    ins, out = spec.split("->")
    x, w = ins.split(",")
    return x, w, out


def _wgrad(w, g):
    """The cotangent of a weight from its float32 gradient, summed over the axes the blocks
    vary over and the weight does not (on a (1, 1, t) mesh the region is manual over 'data'
    too, of size 1: rows split over ('data', 'tensor'))."""
    extra = tuple(sorted(varying_axes(g) - varying_axes(w)))
    return (jax.lax.psum(g, extra) if extra else g).astype(w.dtype)


def _take(x, j, t, axis):
    n = x.shape[axis] // t
    return jax.lax.dynamic_slice_in_dim(x, j * n, n, axis)


def _put(buf, v, j, axis):
    return jax.lax.dynamic_update_slice_in_dim(buf, v, j * v.shape[axis], axis)


def _full(shape, t, axis):
    out = list(shape)
    out[axis] *= t
    return tuple(out)


# ------------------------------------------------------------------------- the two rings

def _ring_gather(blk, t, visit):
    """visit(j, block j) for each of the t blocks of AG(blk), this rank's first: the rank's
    block goes straight to every other rank at once (shift k = 1 .. t - 1), no block waiting
    for another's hop (-1.3% a step against a ring of t - 1 hops, 4x H200, 2026-11-28)."""
    for j, b in direct_gather(blk, AXIS):
        visit(j, b)


def _ring_scatter(t, part_of):
    """Block r (this rank's) of the sum over ranks of part_of(j), the rank's contribution to
    block j: the contribution to block r + k goes straight to rank r + k as soon as it is
    computed (k = 1 .. t - 1, then the rank's own block), and the rank adds the t parts of its
    block at the end."""
    return direct_scatter(part_of, AXIS)


def _accumulate(total: list, k: int, x):
    total[k] = x if total[k] is None else total[k] + x


# ------------------------------------------------------------------------- AG(x) @ w_k

@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _gather(specs, t, axis, x_blk, ws):
    return _gather_fwd(specs, t, axis, x_blk, ws)[0]


def _gather_fwd(specs, t, axis, x_blk, ws):
    outs = [None] * len(ws)

    def visit(j, blk):
        for k, (spec, w) in enumerate(zip(specs, ws)):
            y = jnp.einsum(spec, blk, w)
            if outs[k] is None:
                outs[k] = vary(jnp.zeros(_full(y.shape, t, axis), y.dtype), varying_axes(y))
            outs[k] = _put(outs[k], y, j, axis)
    _ring_gather(x_blk, t, visit)
    return tuple(outs), (x_blk, ws)


def _gather_bwd(specs, t, axis, res, gs):
    """x's blocks travel again for the weight gradients, while the input gradients' partial
    sums travel the other way (XLA interleaves the two independent rings)."""
    x_blk, ws = res
    dws = [None] * len(ws)

    def visit(j, blk):
        for k, g in enumerate(gs):
            _accumulate(dws, k, weight_grad(blk, _take(g, j, t, axis)))
    # the barrier keeps XLA from merging this ring with the forward's (same blocks, same
    # permutes), which would keep every gathered block alive from forward to backward
    _ring_gather(jax.lax.optimization_barrier(x_blk), t, visit)
    dx = _ring_scatter(t, lambda j: sum(_input_grad(spec, _take(g, j, t, axis), w)
                                        for spec, g, w in zip(specs, gs, ws)))
    return dx.astype(x_blk.dtype), tuple(_wgrad(w, dw) for w, dw in zip(ws, dws))


_gather.defvjp(_gather_fwd, _gather_bwd)


# ------------------------------------------------------------------------- RS(z @ w)

@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _scatter(spec, t, axis, z, w):
    return _scatter_fwd(spec, t, axis, z, w)[0]


def _scatter_fwd(spec, t, axis, z, w):
    return (_ring_scatter(t, lambda j: jnp.einsum(spec, _take(z, j, t, axis), w)),
            (z, w))


def _scatter_bwd(spec, t, axis, res, g_blk):
    """dy's blocks travel while each block's input- and weight-gradient GEMMs run."""
    z, w = res
    dz = [vary(jnp.zeros(z.shape, z.dtype), varying_axes(z))]
    dw = [None]

    def visit(j, blk):
        dz[0] = _put(dz[0], _input_grad(spec, blk, w).astype(z.dtype), j, axis)
        _accumulate(dw, 0, weight_grad(_take(z, j, t, axis), blk))
    _ring_gather(g_blk, t, visit)
    return dz[0], _wgrad(w, dw[0])


_scatter.defvjp(_scatter_fwd, _scatter_bwd)


# ------------------------------------------------------------------------- the regions

def gather_dense(sh, x_bsh, gemms, act):
    """[x @ w (+ b) for (spec, w, b) in gemms], x (b, s, h) split as sequence parallelism
    splits it (logical names `act`); the outputs whole along rows and sequence, split as their
    logical axes say (heads, mlp). Named "dense"."""
    specs = tuple(spec for spec, _, _ in gemms)
    ws = tuple(w for _, w, _ in gemms)
    t, axis = sh.mesh.shape[AXIS], 0 if sh.rows else 1
    outs = sh.per_device(lambda x, ws: _gather(specs, t, axis, x, ws),
                         (act, tuple(_names(_parts(s)[1]) for s in specs)),
                         tuple(_names(_parts(s)[2]) for s in specs))(x_bsh, ws)
    return tuple(checkpoint_name(y if b is None else y + b, "dense")
                 for y, (_, _, b) in zip(outs, gemms))


def scatter_dense(sh, z, spec, w, b, act):
    """z @ w (+ b) reduced over 'tensor' and split as sequence parallelism splits it (logical
    names `act`): the row-parallel GEMM with its reduce-scatter. Named "dense"."""
    t, axis = sh.mesh.shape[AXIS], 0 if sh.rows else 1
    y = sh.per_device(lambda z, w: _scatter(spec, t, axis, z, w),
                      (_names(_parts(spec)[0]), _names(_parts(spec)[1])), act)(z, w)
    return checkpoint_name(y if b is None else y + b, "dense")
