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
sequence (`sharding.sequence_parallel_rows`). Weights are arrays, or `dense.WithMeta` under
delayed FP8 scaling (without pipelining, the only place validation lets this run, the layers
get no `dense.MasterGrad` or zero-bubble taps, and with FP8 the ring rounds its weights
itself); biases are added outside the region. The outputs are named "dense" as `dense.dense`
names its own. With train.fp8 the GEMMs take FP8 operands (below).
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name
from jax.sharding import PartitionSpec as P

from ptdp_jax.models import fp8 as F8
from ptdp_jax.models.dense import WithMeta, _input_grad, weight_grad
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


def _like(primal, ct):
    """The cotangent of primal from ct (a weight's float32 gradient, or exponent counts):
    summed over the axes the blocks vary over and primal does not (on a (1, 1, t) mesh the
    region is manual over 'data' too, of size 1: rows split over ('data', 'tensor')), in
    primal's dtype."""
    extra = tuple(sorted(varying_axes(ct) - varying_axes(primal)))
    ct = jax.lax.psum(ct, extra) if extra else ct
    return vary(ct, varying_axes(primal)).astype(primal.dtype)


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


# ------------------------------------------------------------------------- FP8 operands
#
# With train.fp8 the rings' GEMMs take FP8 operands at the scales one device picks: a
# tensor's scale from the max over its blocks (the ring's ranks), or from its delayed-scaling
# rows. Each rank reports the exponent its own block needed, and the gradient path's sum over
# ranks keeps the largest (models/fp8.py). The FP8 arrays are moved and kept as their bytes
# (uint8): half the bytes of the compute dtype on the wire, and no FP8 value for a backend to
# move through another format (fp8.residual).


class FP8(NamedTuple):
    """The rings' FP8 mode (static): steady as Sharder.fp8_steady."""
    steady: bool = False


def _scale(x, fmt, row=None, steady=False):
    """(the scale x rounds at, x's block's exponent one-hot or None): row None: current
    scaling, the whole tensor's own scale; else the scale the delayed row names (where it
    names none: the whole tensor's own)."""
    amax = F8.amax_of(x)
    whole = None if row is not None and steady else F8.scale_of_amax(
        jax.lax.pmax(amax, AXIS), fmt)
    if row is None:
        return whole, None
    return F8.scale_from_bins(row, whole), F8.observed_amax(amax, fmt)[1]


def _rows(metas, k):
    """GEMM k's delayed rows (2, NBINS), or None (current scaling: no metas)."""
    return metas[k] if metas else None


def _seen(meta, seen_x, seen_g):
    """meta's cotangent: the exponents x's and dy's blocks needed (summed over the blocks)."""
    axes = varying_axes(seen_x) | varying_axes(seen_g)
    return _like(meta, jnp.stack([vary(seen_x, axes), vary(seen_g, axes)]))


def _round_x(x, rows, steady):
    """[(scale, seen)] of x for each GEMM, one shared entry under current scaling (rows all
    None), and {id(scale): FP8 wire block}: what travels, one block per distinct scale."""
    if all(r is None for r in rows):
        scales = [_scale(x, F8.E4M3)] * len(rows)
    else:
        scales = [_scale(x, F8.E4M3, r[0], steady) for r in rows]
    wires = {}
    for sx, _ in scales:
        if id(sx) not in wires:
            wires[id(sx)] = _bytes(F8.rounded(x, F8.E4M3, sx))
    return scales, wires


def _bytes(q):
    return jax.lax.bitcast_convert_type(q, jnp.uint8)


def _value(b, fmt, s, dtype):
    """An FP8 array kept as its bytes b, back as convert(fp8) * s in dtype."""
    return F8.dequantize(jax.lax.bitcast_convert_type(b, fmt), s, dtype)


def _round_w(w):
    """(w rounded to E4M3 at the whole weight's scale, as bytes; the scale)."""
    sw, _ = _scale(w, F8.E4M3)
    return _bytes(F8.rounded(w, F8.E4M3, sw)), sw


def _round_g(g, row, steady):
    """(g rounded to E5M2 in g's dtype, its block's exponent one-hot or None)."""
    sg, seen = _scale(g, F8.E5M2, None if row is None else row[1], steady)
    return F8.dequantize(F8.rounded(g, F8.E5M2, sg), sg, g.dtype), seen


# ------------------------------------------------------------------------- AG(x) @ w_k
#
# The residuals of both rings are their inputs alone: a residual made inside a region nested
# in the train step's shard_map gets a sharding that the lowering refuses (jax 0.10). The FP8
# backward rounds x (and z) and the weights again, to the same values.

@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _gather(specs, t, axis, f8, x_blk, ws, metas):
    return _gather_fwd(specs, t, axis, f8, x_blk, ws, metas)[0]


def _gather_fwd(specs, t, axis, f8, x_blk, ws, metas):
    sent, x_of, w_of, _ = _gather_operands(f8, x_blk, ws, metas)
    outs = [None] * len(specs)

    def visit(j, blk):
        for k, spec in enumerate(specs):
            y = jnp.einsum(spec, x_of(k, blk), w_of(k))
            if outs[k] is None:
                outs[k] = vary(jnp.zeros(_full(y.shape, t, axis), y.dtype), varying_axes(y))
            outs[k] = _put(outs[k], y, j, axis)
    _ring_gather(sent, t, visit)
    return tuple(outs), (x_blk, ws, metas)


def _gather_operands(f8, x_blk, ws, metas):
    """(what travels, x_of(k, received block), w_of(k), x's seen one-hots): GEMM k's operands;
    without f8 the blocks and weights as they are."""
    if f8 is None:
        return x_blk, (lambda k, blk: blk), (lambda k: ws[k]), ()
    dt = x_blk.dtype
    scales, wires = _round_x(x_blk, [_rows(metas, k) for k in range(len(ws))], f8.steady)
    slot = [tuple(wires).index(id(sx)) for sx, _ in scales]
    qws = [_round_w(w) for w in ws]
    return (tuple(wires.values()),
            lambda k, blks: _value(blks[slot[k]], F8.E4M3, scales[k][0], dt),
            lambda k: _value(qws[k][0], F8.E4M3, qws[k][1], dt),
            tuple(seen for _, seen in scales))


def _gather_bwd(specs, t, axis, f8, res, gs):
    """x's blocks travel again for the weight gradients, while the input gradients' partial
    sums travel the other way (XLA interleaves the two independent rings)."""
    x_blk, ws, metas = res
    sent, x_of, w_of, seen_x = _gather_operands(f8, x_blk, ws, metas)
    seen_g = [None] * len(gs)
    if f8 is not None:
        rounded = [_round_g(g, _rows(metas, k), f8.steady) for k, g in enumerate(gs)]
        gs, seen_g = [g for g, _ in rounded], [seen for _, seen in rounded]
    dws = [None] * len(ws)

    def visit(j, blk):
        for k, g in enumerate(gs):
            _accumulate(dws, k, weight_grad(x_of(k, blk), _take(g, j, t, axis)))
    # the barrier keeps XLA from merging this ring with the forward's (same blocks, same
    # permutes), which would keep every gathered block alive from forward to backward
    _ring_gather(jax.lax.optimization_barrier(sent), t, visit)
    dx = _ring_scatter(t, lambda j: sum(_input_grad(spec, _take(g, j, t, axis), w_of(k))
                                        for k, (spec, g) in enumerate(zip(specs, gs))))
    dmetas = tuple(_seen(m, seen_x[k], seen_g[k]) for k, m in enumerate(metas))
    return (dx.astype(x_blk.dtype), tuple(_like(w, dw) for w, dw in zip(ws, dws)), dmetas)


_gather.defvjp(_gather_fwd, _gather_bwd)


# ------------------------------------------------------------------------- RS(z @ w)

@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2, 3))
def _scatter(spec, t, axis, f8, z, w, metas):
    return _scatter_fwd(spec, t, axis, f8, z, w, metas)[0]


def _scatter_fwd(spec, t, axis, f8, z, w, metas):
    z_of, wd, _ = _scatter_operands(f8, z, w, metas, t, axis)
    return _ring_scatter(t, lambda j: jnp.einsum(spec, z_of(j), wd)), (z, w, metas)


def _scatter_operands(f8, z, w, metas, t, axis):
    """(z_of(j): block j of z, w, z's seen one-hot) as the GEMMs take them."""
    if f8 is None:
        return (lambda j: _take(z, j, t, axis)), w, None
    rows = _rows(metas, 0)
    sz, seen_z = _scale(z, F8.E4M3, None if rows is None else rows[0], f8.steady)
    qz, (qw, sw) = _bytes(F8.rounded(z, F8.E4M3, sz)), _round_w(w)
    return ((lambda j: _value(_take(qz, j, t, axis), F8.E4M3, sz, z.dtype)),
            _value(qw, F8.E4M3, sw, z.dtype), seen_z)


def _scatter_bwd(spec, t, axis, f8, res, g_blk):
    """dy's blocks travel (as FP8 with train.fp8) while each block's input- and
    weight-gradient GEMMs run."""
    z, w, metas = res
    z_of, wd, seen_z = _scatter_operands(f8, z, w, metas, t, axis)
    g_of, seen_g = (lambda blk: blk), None
    if f8 is not None:
        rows = _rows(metas, 0)
        sg, seen_g = _scale(g_blk, F8.E5M2, None if rows is None else rows[1], f8.steady)
        g_blk = _bytes(F8.rounded(g_blk, F8.E5M2, sg))
        g_of = lambda blk: _value(blk, F8.E5M2, sg, z.dtype)          # noqa: E731
    dz = [vary(jnp.zeros(z.shape, z.dtype), varying_axes(z))]
    dw = [None]

    def visit(j, blk):
        g = g_of(blk)
        dz[0] = _put(dz[0], _input_grad(spec, g, wd).astype(z.dtype), j, axis)
        _accumulate(dw, 0, weight_grad(z_of(j), g))
    _ring_gather(g_blk, t, visit)
    dmetas = tuple(_seen(m, seen_z, seen_g) for m in metas)
    return dz[0], _like(w, dw[0]), dmetas


_scatter.defvjp(_scatter_fwd, _scatter_bwd)


# ------------------------------------------------------------------------- the regions

def _split_meta(w):
    """(w, its delayed rows or None) of a ring GEMM's weight (dense.WithMeta or an array)."""
    return (w.w, w.meta) if isinstance(w, WithMeta) else (w, None)


def _fp8_mode(sh):
    return FP8(sh.fp8_steady) if sh.fp8 else None


def gather_dense(sh, x_bsh, gemms, act):
    """[x @ w (+ b) for (spec, w, b) in gemms], x (b, s, h) split as sequence parallelism
    splits it (logical names `act`); the outputs whole along rows and sequence, split as their
    logical axes say (heads, mlp). w: an array, or dense.WithMeta under delayed FP8 scaling.
    Named "dense"."""
    specs = tuple(spec for spec, _, _ in gemms)
    ws, metas = zip(*(_split_meta(w) for _, w, _ in gemms))
    metas = metas if sh.fp8 and metas[0] is not None else ()
    t, axis, f8 = sh.mesh.shape[AXIS], 0 if sh.rows else 1, _fp8_mode(sh)

    outs = sh.per_device(partial(_gather, specs, t, axis, f8), (act, tuple(_names(_parts(s)[1]) for s in specs),
                                  tuple(P() for _ in metas)),
                         tuple(_names(_parts(s)[2]) for s in specs))(x_bsh, ws, metas)
    return tuple(checkpoint_name(y if b is None else y + b, "dense")
                 for y, (_, _, b) in zip(outs, gemms))


def scatter_dense(sh, z, spec, w, b, act):
    """z @ w (+ b) reduced over 'tensor' and split as sequence parallelism splits it (logical
    names `act`): the row-parallel GEMM with its reduce-scatter. w: an array, or
    dense.WithMeta under delayed FP8 scaling. Named "dense"."""
    w, meta = _split_meta(w)
    metas = (meta,) if sh.fp8 and meta is not None else ()
    t, axis, f8 = sh.mesh.shape[AXIS], 0 if sh.rows else 1, _fp8_mode(sh)

    y = sh.per_device(partial(_scatter, spec, t, axis, f8), (_names(_parts(spec)[0]), _names(_parts(spec)[1]),
                               tuple(P() for _ in metas)), act)(z, w, metas)
    return checkpoint_name(y if b is None else y + b, "dense")
