"""The GEMMs of a layer, through one function, `dense(spec, x, w)`.

Convention: x and y lead with (batch, seq); w's dimensions are x's trailing dimensions that are
contracted followed by y's trailing ones ("bsh,hf->bsf", "bsnd,ndh->bsh"), so the weight
gradient is always x contracted with dy over (batch, seq).

The output (with the bias, if any) is named "dense" for the selective-recomputation policy (keep
GEMM outputs). The
weight argument chooses how the backward treats the weight:

    w (an array)            plain autodiff
    MasterGrad(w, master)   the weight gradient is taken against the float32 master, straight
                            out of the GEMM in float32, so a caller can add it to a float32
                            accumulator inside the GEMM (cuBLAS beta = 1)
    Taps(w, x_tap, g_tap)   no weight gradient: the backward exports the GEMM's input x and
                            output gradient dy as the "gradients" of the two zero taps, for a
                            later weight-gradient op (the zero-bubble B / W split)
    Probe(w, name, record)  plain, and records x's and y's shapes under name (to size taps)
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name


class MasterGrad(NamedTuple):
    w: jax.Array           # compute dtype
    master: jax.Array      # float32; receives the gradient


class Taps(NamedTuple):
    w: jax.Array
    x_tap: jax.Array       # zeros shaped like the GEMM input; its "gradient" is the input
    g_tap: jax.Array       # zeros shaped like the GEMM output; its "gradient" is dy


class Probe(NamedTuple):
    w: jax.Array
    name: str
    record: dict           # name -> (x shape, y shape), filled while tracing


def dense(spec: str, x, w, b=None):
    """x @ w (+ b), named "dense": selective recomputation keeps it with the bias added, so
    the backward does not add the bias again (the GEMM's epilogue adds it)."""
    if isinstance(w, MasterGrad):
        y = _master_grad(spec, x, w.w, w.master)
    elif isinstance(w, Taps):
        y = _taps(spec, x, w.w, w.x_tap, w.g_tap)
    elif isinstance(w, Probe):
        y = jnp.einsum(spec, x, w.w)
        w.record[w.name] = (x.shape, y.shape)
    else:
        y = jnp.einsum(spec, x, w)
    if b is not None:
        y = y + b
    return checkpoint_name(y, "dense")


def weight_grad(x, g):
    """The weight gradient of a dense op from its input and output gradient, in float32."""
    return jax.lax.dot_general(x, g, (((0, 1), (0, 1)), ((), ())),
                               preferred_element_type=jnp.float32)


def _input_grad(spec, g, w):
    xs, ws = spec.split("->")[0].split(",")
    return jnp.einsum(f"{spec.split('->')[1]},{ws}->{xs}", g, w)


@partial(jax.custom_vjp, nondiff_argnums=(0,))
def _master_grad(spec, x, w, master):
    return jnp.einsum(spec, x, w)


def _master_grad_fwd(spec, x, w, master):
    return jnp.einsum(spec, x, w), (x, w)


def _master_grad_bwd(spec, res, g):
    x, w = res
    return _input_grad(spec, g, w), None, weight_grad(x, g)


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
