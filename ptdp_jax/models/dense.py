"""The GEMMs of a layer, through one function, `dense(spec, x, w)`.

Convention: x and y lead with (batch, seq); w's dimensions are x's trailing dimensions that are
contracted followed by y's trailing ones ("bsh,hf->bsf", "bsnd,ndh->bsh"), so the weight
gradient is always x contracted with dy over (batch, seq).

The output (with the bias, if any) is named "dense" for the selective-recomputation policy (keep
GEMM outputs). The
weight argument chooses how the backward treats the weight:

    w (an array)            plain autodiff
    MasterGrad(w, master)   the weight gradient is taken against master, in master's dtype:
                            for a float32 master straight out of the GEMM in float32, so a
                            caller can add it to a float32 accumulator inside the GEMM (cuBLAS
                            beta = 1)
    Taps(w, x_tap, g_tap)   no weight gradient: the backward exports the GEMM's input x and
                            output gradient dy as the "gradients" of the two zero taps, for a
                            later weight-gradient op (the zero-bubble B / W split)
    Probe(w, name, record)  plain, and records x's and y's shapes under name (to size taps)
    WithMeta(w, meta)       any of these, with the GEMM's delayed FP8 scaling rows

With fp8 (train.fp8) the GEMMs take FP8 operands (models/fp8.py) in every one of these forms
(the w of MasterGrad and Taps may come as fp8.Prequantized, rounded once a step); the taps then
export x and dy as the FP8 operands the backward used, (FP8 array, scale) pairs (`tap_structs`):
half the bytes, and W's GEMM reads them as they are.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from ptdp_jax.models import fp8 as F8


class MasterGrad(NamedTuple):
    w: jax.Array           # compute dtype
    master: jax.Array      # float32; receives the gradient


class Taps(NamedTuple):
    w: jax.Array
    x_tap: object          # zeros shaped like the GEMM input; its "gradient" is the input
    g_tap: object          # zeros shaped like the GEMM output; its "gradient" is dy
                           # (with fp8 each an (FP8 array, float32 scale) pair: `tap_structs`)


class WithMeta(NamedTuple):
    w: object              # a weight in any of these forms
    meta: jax.Array        # (2, NBINS): with fp8, delayed scaling's rows (models/fp8.py)


class Probe(NamedTuple):
    w: jax.Array
    name: str
    record: dict           # name -> (x shape, y shape), filled while tracing


def dense(spec: str, x, w, b=None, fp8: bool = False, steady: bool = False):
    """x @ w (+ b), named "dense": selective recomputation keeps it with the bias added, so
    the backward does not add the bias again (the GEMM's epilogue adds it). fp8: FP8 operands,
    with delayed scaling where w comes as WithMeta, else current scaling; steady: the delayed
    rows are known to hold an exponent each (models/fp8.scale_from_bins)."""
    meta = None
    if isinstance(w, WithMeta):
        w, meta = w.w, w.meta
    if isinstance(w, Probe):
        y = jnp.einsum(spec, x, F8.plain(w.w, x.dtype))
        w.record[w.name] = (x.shape, y.shape)
    elif fp8 and meta is not None:
        y = _delayed(spec, steady, x, w, meta)
    elif isinstance(w, MasterGrad):
        y = (_master_grad_fp8 if fp8 else _master_grad)(spec, _dtype(w.master), x, w.w,
                                                        w.master)
    elif isinstance(w, Taps):
        y = (_taps_fp8 if fp8 else _taps)(spec, x, w.w, w.x_tap, w.g_tap)
    else:
        y = F8.einsum(spec, x, w) if fp8 else jnp.einsum(spec, x, w)
    if b is not None:
        y = y + b
    return checkpoint_name(y, "dense")


def weight_grad(x, g, dtype=None):
    """The weight gradient of a dense op from its input and output gradient, in float32; x and
    g as the taps export them (fp8: (FP8 array, scale) pairs, read in the compute `dtype`)."""
    if isinstance(x, tuple):
        x, g = F8.operand(*x, dtype), F8.operand(*g, dtype)
    return F8.weight_grad(x, g)


def tap_structs(x_shape, y_shape, dtype, fp8: bool):
    """(x, dy) as a GEMM's taps export them, ShapeDtypeStructs: arrays in the compute dtype;
    fp8: (E4M3 x, scale), (E5M2 dy, scale) (arrays as fp8.residual keeps them)."""
    sds = jax.ShapeDtypeStruct
    if not fp8:
        return sds(x_shape, dtype), sds(y_shape, dtype)
    scale = sds((), jnp.float32)
    return ((sds(x_shape, F8.residual_dtype(F8.E4M3, dtype)), scale),
            (sds(y_shape, F8.residual_dtype(F8.E5M2, dtype)), scale))


_input_grad = F8.input_grad


def _dtype(master):
    """master's dtype, a static argument of the MasterGrad GEMMs: the dtype of the weight
    gradient they give (a float32 master's: the GEMM's own float32 output)."""
    return jnp.dtype(master.dtype)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _master_grad(spec, dt, x, w, master):
    return jnp.einsum(spec, x, w)


def _master_grad_fwd(spec, dt, x, w, master):
    return jnp.einsum(spec, x, w), (x, w)


def _master_grad_bwd(spec, dt, res, g):
    x, w = res
    return _input_grad(spec, g, w), None, weight_grad(x, g).astype(dt)


_master_grad.defvjp(_master_grad_fwd, _master_grad_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _taps(spec, x, w, x_tap, g_tap):
    return jnp.einsum(spec, x, w)


def _taps_fwd(spec, x, w, x_tap, g_tap):
    return jnp.einsum(spec, x, w), (x, w)


def _taps_bwd(spec, res, g):
    x, w = res
    return _input_grad(spec, g, w), None, x, g


_taps.defvjp(_taps_fwd, _taps_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _master_grad_fp8(spec, dt, x, w, master):
    return F8.einsum(spec, x, w)


def _master_grad_fp8_bwd(spec, dt, res, g):
    dx, dw = F8.backward(spec, *res, g, master=True)
    return dx, None, dw.astype(dt)


_master_grad_fp8.defvjp(lambda spec, dt, x, w, master: F8.forward(spec, x, w),
                        _master_grad_fp8_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _taps_fp8(spec, x, w, x_tap, g_tap):
    return F8.einsum(spec, x, w)


def _taps_fp8_bwd(spec, res, g):
    """The input gradient on FP8 operands; x's and dy's FP8 operands go to the taps."""
    qx, sx, qw, sw = res
    dt = g.dtype
    qg, sg = F8.quantized(g, F8.E5M2)
    dx = F8.input_grad(spec, F8.dequantize(qg, sg, dt), F8.operand(qw, sw, dt))
    return dx, None, (qx, sx), F8.residual(qg, sg, dt)


_taps_fp8.defvjp(lambda spec, x, w, x_tap, g_tap: F8.forward(spec, x, w), _taps_fp8_bwd)


def _delayed(spec, steady, x, w, meta):
    """The FP8 GEMM with delayed scaling, in each of dense's weight forms."""
    if isinstance(w, MasterGrad):
        return _master_grad_delayed(spec, steady, _dtype(w.master), x, w.w, w.master, meta)
    if isinstance(w, Taps):
        return _taps_delayed(spec, steady, x, w.w, w.x_tap, w.g_tap, meta)
    return F8.delayed_einsum(spec, steady, x, w, meta)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1, 2))
def _master_grad_delayed(spec, steady, dt, x, w, master, meta):
    return F8.delayed_einsum(spec, steady, x, w, meta)


def _master_grad_delayed_bwd(spec, steady, dt, res, g):
    dx, dw, seen, _, _ = F8.delayed_backward(spec, steady, *res, g, master=True)
    return dx, None, dw.astype(dt), seen


_master_grad_delayed.defvjp(
    lambda spec, steady, dt, x, w, master, meta: F8.delayed_forward(spec, steady, x, w, meta),
    _master_grad_delayed_bwd)


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _taps_delayed(spec, steady, x, w, x_tap, g_tap, meta):
    return F8.delayed_einsum(spec, steady, x, w, meta)


def _taps_delayed_bwd(spec, steady, res, g):
    """The input gradient; x's and dy's FP8 operands (at the history's scales) go to the taps."""
    dx, _, seen, xs, gs = F8.delayed_backward(spec, steady, *res, g, master=False)
    return dx, None, xs, gs, seen


_taps_delayed.defvjp(
    lambda spec, steady, x, w, x_tap, g_tap, meta: F8.delayed_forward(spec, steady, x, w, meta),
    _taps_delayed_bwd)
