"""FP8 GEMM operands with per-tensor current scaling (train.fp8).

Weights and activations are rounded to E4M3, output gradients to E5M2 (Megatron's "hybrid"),
each tensor with one scale from its own max |x| in this step (current scaling). A scale is the
least power of two s with max|x| / s <= the format's largest value, so that rounding is the
only error (dividing by s is exact), a tensor already on the FP8 grid comes back unchanged
(`qdq` is idempotent: the tensor ring's backward rounds its operands again), and a layout
whose reductions differ in the last bit still picks the same scale as one device.

The operands reach the GEMM as convert(fp8) * scale, the form XLA's GPU GEMM rewriter turns
into one cuBLASLt FP8 GEMM (float32 accumulation, output in the compute dtype). Elsewhere
(CPU) the same numbers come from an emulated GEMM. The amax of a tensor is over the whole
tensor: GSPMD reduces it over 'tensor' where the tensor is split, and over a sequence's chunks
under context parallelism (`context.sequence_max`); data-parallel replicas and pipeline stages
each quantize their own microbatches, as one device does microbatch by microbatch.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ptdp_jax.parallel.context import sequence_max

E4M3 = jnp.float8_e4m3fn     # weights and activations (largest value 448)
E5M2 = jnp.float8_e5m2       # output gradients (largest value 57344)


def scale_of(x, fmt):
    """float32 scalar: the least power of two s with max|x| / s <= finfo(fmt).max (1 where
    x is all zeros; not finite where x is not, so a bad step stays visible)."""
    return scale_of_amax(amax_of(x), fmt)


def amax_of(x):
    """max |x| as a float32 scalar, over the whole sequence where it is split over devices
    (context parallelism: one scale for a tensor, as on one device)."""
    return sequence_max(jnp.max(jnp.abs(x)).astype(jnp.float32), x)


def scale_of_amax(amax, fmt):
    """`scale_of` from a tensor's max |x| (for a tensor split over devices: the max of its
    blocks')."""
    s = power_of_two_above(amax / float(jnp.finfo(fmt).max))
    s = jax.lax.select(jnp.isfinite(amax), s, amax)
    return jax.lax.select(amax == 0, jnp.ones_like(s), s)


# Powers of two by their float32 bits: a handful of integer ops, where jnp.frexp and jnp.ldexp
# each lower to dozens, and an FP8 step computes hundreds of scales. XLA flushes subnormal
# floats to zero on CPU and GPU, so only normal numbers and zero occur.
_MANT, _EXP_ONE = 0x007FFFFF, 0x00800000


def power_of_two_above(r):
    """The least power of two >= r (float32, finite, r >= 0); 1 for 0, as with frexp, whose
    exponent of 0 is 0: a tensor whose amax / max flushes to zero keeps scale 1."""
    r = jnp.asarray(r, jnp.float32)
    bits = jax.lax.bitcast_convert_type(r, jnp.int32)
    up = jax.lax.select((bits & _MANT) == 0, bits, (bits & ~_MANT) + _EXP_ONE)
    p = jax.lax.bitcast_convert_type(up, jnp.float32)
    return jax.lax.select(r == 0, jnp.ones_like(r), p)


def two_to(e):
    """2.0 ** e as float32 for an integer e <= 127 (0 below -126, as XLA's flushed ldexp)."""
    e = jnp.asarray(e, jnp.int32)
    bits = jnp.left_shift(jnp.clip(e + 127, 0, 254), 23)
    return jax.lax.bitcast_convert_type(bits, jnp.float32)


def quantize(x, fmt, s):
    """x / s rounded to fmt (saturating at its largest value)."""
    big = float(jnp.finfo(fmt).max)
    return jnp.clip(x / s.astype(x.dtype), -big, big).astype(fmt)


def dequantize(q, s, dtype):
    return q.astype(dtype) * s.astype(dtype)


def qdq(x, fmt):
    """x rounded to fmt at its own scale, in x's dtype, as convert(fp8) * scale."""
    q, s = quantized(x, fmt)
    return dequantize(q, s, x.dtype)


def quantized(x, fmt):
    """(x / s rounded to fmt and materialized, s) at x's own scale s."""
    s = scale_of(x, fmt)
    return rounded(x, fmt, s), s


def rounded(x, fmt, s):
    """A GEMM operand: x / s rounded to fmt and materialized (`_stored`)."""
    return _stored(quantize(x, fmt, s))


class Prequantized(NamedTuple):
    """A GEMM weight rounded to E4M3 once a step (`prequantize`), for all its microbatches'
    GEMMs: the numbers of rounding it in each GEMM, without two passes over it per microbatch
    (forward and recomputation). It comes in a dense.MasterGrad, whose master receives the
    gradient; its GEMMs run in the dtype of their x."""
    q: jax.Array           # E4M3, as the weight: the input gradient's GEMM operand
    s: jax.Array           # float32 scale
    qt: jax.Array          # q with its contracted dimensions last: the forward GEMM's operand


def prequantize(w, spec: str) -> Prequantized:
    """w of dense's einsum `spec` rounded, and transposed once a step for the forward:
    cuBLASLt's FP8 GEMMs take both operands contracted along their last dimension, and a
    transpose XLA adds inside the microbatch loop runs once a microbatch."""
    q, s = quantized(w, E4M3)
    k = _contracted(spec)
    qt = jnp.transpose(q, tuple(range(k, q.ndim)) + tuple(range(k)))
    return Prequantized(q, s, _stored(qt))


def _contracted(spec: str) -> int:
    """How many leading dimensions of dense's weight the einsum contracts."""
    xs, ws = spec.split("->")[0].split(",")
    return sum(1 for c in ws if c in xs)


def _forward_operand(spec, w, qw):
    """(spec, FP8 weight) of a forward GEMM: qw, or a Prequantized w's transposed copy with
    the spec that reads it."""
    if not isinstance(w, Prequantized):
        return spec, qw
    (xs, ws), ys = spec.split("->")[0].split(","), spec.split("->")[1]
    k = _contracted(spec)
    return f"{xs},{ws[k:]}{ws[:k]}->{ys}", w.qt


def _weight(w, x):
    """(q, s, the GEMM's dtype for w) of a GEMM weight: as prequantized (x's dtype), else
    rounded here (current scaling; w's dtype)."""
    if isinstance(w, Prequantized):
        return w.q, w.s, x.dtype
    return (*quantized(w, E4M3), w.dtype)


def _gemm(spec, qx, sx, dtype, w, qw, sw, wdt):
    """The forward GEMM on convert(fp8) * scale operands, the form XLA turns into one FP8 GEMM."""
    fspec, fq = _forward_operand(spec, w, qw)
    return jnp.einsum(fspec, dequantize(qx, sx, dtype), dequantize(fq, sw, wdt))


def plain(w, dtype):
    """A weight in any form here as an array of dtype (to record shapes)."""
    return dequantize(w.q, w.s, dtype) if isinstance(w, Prequantized) else w


def _stored(q):
    """q materialized as it is (one byte an element): XLA may not fuse its rounding into the
    transposes that the FP8 GEMMs' operand layouts need (2-5x slower kernels there; the
    LLaMA-7B-shape step 0.2360 -> 0.2232 s on 1x H200, 2026-11-28)."""
    return jax.lax.optimization_barrier(q)


def input_grad(spec: str, g, w):
    """The input gradient of einsum(spec, x, w) from the output gradient g."""
    xs, ws = spec.split("->")[0].split(",")
    return jnp.einsum(f"{spec.split('->')[1]},{ws}->{xs}", g, w)


def weight_grad(x, g):
    """x contracted with g over (batch, seq): the weight gradient, in float32."""
    return jax.lax.dot_general(x, g, (((0, 1), (0, 1)), ((), ())),
                               preferred_element_type=jnp.float32)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def einsum(spec: str, x, w):
    """einsum(spec, x, w) on E4M3 operands; its backward on an E5M2 output gradient. The
    residuals are the FP8 operands and their scales (half the bytes of x and w)."""
    return forward(spec, x, w)[0]


def forward(spec, x, w):
    """(y, residuals) of `einsum`: each operand as (FP8 array, scale), x's recomputed (not
    named) under selective recomputation; keeping them cost a pipeline stash 25 GiB on
    LLaMA-3-8B (seq 4096, zb-phased) and saved no time on one GPU. w: an array or
    Prequantized."""
    (qx, sx), (qw, sw, wdt) = quantized(x, E4M3), _weight(w, x)
    y = _gemm(spec, qx, sx, x.dtype, w, qw, sw, wdt)
    return y, (*residual(qx, sx, x.dtype), *residual(qw, sw, wdt))


def residual(q, s, dtype):
    """An FP8 operand as the backward (or a zero-bubble W) keeps it: (q, s); on the CPU
    backend (q dequantized, s), since XLA's CPU backend moves FP8 values it rematerializes
    through an IEEE-style E4M3 (largest value 240), which turns E4M3FN's top binade into NaN.
    The same numbers."""
    if jax.default_backend() == "cpu":
        return dequantize(q, s, dtype), s
    return q, s


def residual_dtype(fmt, dtype):
    """The dtype of a `residual`'s array: fmt, or on the CPU backend the compute dtype."""
    return dtype if jax.default_backend() == "cpu" else fmt


def operand(q, s, dtype):
    """A `residual` back in `dtype` (convert(fp8) * scale where it is FP8)."""
    return dequantize(q, s, dtype) if q.dtype in (E4M3, E5M2) else q.astype(dtype)


def backward(spec, qx, sx, qw, sw, g, master: bool):
    """(dx, dw) of an FP8 einsum from its residuals; dw in float32 where `master` (for
    dense.MasterGrad), else in the compute dtype."""
    dt = g.dtype
    g = qdq(g, E5M2)
    x, w = operand(qx, sx, dt), operand(qw, sw, dt)
    dw = weight_grad(x, g)
    return input_grad(spec, g, w), (dw if master else dw.astype(dt))


def _einsum_bwd(spec, res, g):
    return backward(spec, *res, g, master=False)


einsum.defvjp(forward, _einsum_bwd)


# ------------------------------------------------------------- delayed scaling (train.fp8_recipe)
#
# An activation's and an output gradient's scale come from the amax history in the train state
# (training/fp8_state.py), handed to each GEMM as `meta`, (2, NBINS) one-hot rows (x, dy) of the
# scale's exponent (all zeros: no history yet, so the tensor's own scale, as current scaling: a
# fresh run's first step). The backward returns as meta's "gradient"
# the exponents this microbatch needed, one-hot: the sums that the gradient path takes over
# microbatches, data replicas and pipeline stages then hold a count per exponent, whose highest
# nonzero bin is the max over the whole batch, as one device sees it. Weights keep current
# scaling (they are quantized once a step; a history would only add error).

NBINS, E_MIN = 256, -128     # scale exponents -128 .. 127


def exponent(s):
    """The integer e of a power of two s = 2^e (float32, normal)."""
    bits = jax.lax.bitcast_convert_type(jnp.asarray(s, jnp.float32), jnp.int32)
    return (jnp.right_shift(bits, 23) & 0xFF) - 127


def scale_from_bins(row, own):
    """The scale a one-hot row of exponent bins names; where the row is all zeros (no history
    yet), `own`, the tensor's own scale (current scaling). own=None: the row is known to hold
    an exponent (a steady step), so the rounding need not wait for the tensor's amax."""
    row = row.astype(jnp.float32)
    e = jnp.sum(row * (jnp.arange(NBINS, dtype=jnp.float32) + E_MIN)).astype(jnp.int32)
    named = two_to(e)
    return named if own is None else jnp.where(jnp.sum(row) > 0, named, own)


def observed(x, fmt):
    """(scale_of(x, fmt), its exponent as an (NBINS,) float32 one-hot), from one pass over x;
    the one-hot is zeros where x is all zero or not finite (no observation: a non-finite step
    is skipped and leaves no history)."""
    return observed_amax(amax_of(x), fmt)


def observed_amax(amax, fmt):
    """`observed` from a tensor's max |x|."""
    own = scale_of_amax(amax, fmt)
    seen = jax.nn.one_hot(jnp.clip(exponent(own) - E_MIN, 0, NBINS - 1), NBINS,
                          dtype=jnp.float32)
    return own, jnp.where(jnp.isfinite(amax) & (amax > 0), seen, 0.0)


def delayed_forward(spec, steady, x, w, meta):
    """(y, residuals) of `delayed_einsum`: x rounded at its history's scale (saturating), w at
    its own (w: an array or Prequantized). steady: every history row holds an exponent (no
    fallback to x's own scale)."""
    own, seen_x = observed(x, E4M3)
    sx = scale_from_bins(meta[0], None if steady else own)
    qx = rounded(x, E4M3, sx)
    qw, sw, wdt = _weight(w, x)
    y = _gemm(spec, qx, sx, x.dtype, w, qw, sw, wdt)
    return y, (*residual(qx, sx, x.dtype), *residual(qw, sw, wdt), seen_x, meta)


def delayed_backward(spec, steady, qx, sx, qw, sw, seen_x, meta, g, master: bool):
    """(dx, dw, what the GEMM saw, x's and dy's FP8 operands as `residual`s) from
    `delayed_forward`'s residuals; g rounded to E5M2 at its history's scale. dw in float32
    where `master`, else in the compute dtype."""
    dt = g.dtype
    own, seen_g = observed(g, E5M2)
    sg = scale_from_bins(meta[1], None if steady else own)
    qg = rounded(g, E5M2, sg)
    gq = dequantize(qg, sg, dt)
    x, w = operand(qx, sx, dt), operand(qw, sw, dt)
    dw = weight_grad(x, gq)
    seen = jnp.stack([seen_x, seen_g]).astype(meta.dtype)
    return (input_grad(spec, gq, w), (dw if master else dw.astype(dt)), seen, (qx, sx),
            residual(qg, sg, dt))


@partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def delayed_einsum(spec: str, steady: bool, x, w, meta):
    """einsum(spec, x, w) on E4M3 operands, x at the scale meta[0] names; the backward's dy in
    E5M2 at meta[1]'s; meta's cotangent: the exponents seen (see above)."""
    return delayed_forward(spec, steady, x, w, meta)[0]


def _delayed_bwd(spec, steady, res, g):
    dx, dw, seen, _, _ = delayed_backward(spec, steady, *res, g, master=False)
    return dx, dw, seen


delayed_einsum.defvjp(delayed_forward, _delayed_bwd)
