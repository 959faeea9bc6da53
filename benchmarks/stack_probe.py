"""How fast XLA stacks L per-layer float32 gradients into the state's (L, ...) layout
(`models.model.stack_layers`), by variant, against a plain copy of the same bytes.

    python benchmarks/stack_probe.py [--layers 24] [--rows 2048] [--cols 8192] [--reps 20]

Standalone, jnp.stack's concatenate runs at ~1.3 TB/s on one H200 and slices written into an
uninitialised buffer at ~2.7 TB/s. In the train step this does not matter: XLA fuses the
concatenate into the AdamW update that reads it (the step's `loop_concatenate_fusion`
kernels are that update, ~3.9 TB/s over gradients, weights and both moments), and any other
stacking adds a pass before it (session 37, benchmarks/NOTES.md). Variants:
  stack     jnp.stack (today: one concatenate fusion)
  flat      each piece flattened, one 1-D concatenate, reshaped
  dus0      dynamic-update-slices into zeros, one per layer (in place)
  dusE      the same into lax.empty (XLA's AllocateBuffer on GPU; zeros where absent)
  dusB      the same into zeros behind an optimization barrier
  copy      x + 0 of one (L, rows, cols) array: the bandwidth such a pass can reach
With --computed the pieces are made in the same jit (float32 GEMM outputs, as a step's
gradients are), and `gemms` (the pieces returned unstacked) is the baseline to subtract;
`dusEbar` is dusE with an optimization barrier after each slice written.
Prints one JSON line per variant: milliseconds per call (median of --reps) and TB/s over the
bytes read and written (2 L rows cols 4)."""
from __future__ import annotations

import argparse
import json
import statistics
import time

import os
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ptdp_jax.pipeline.pipe_state import empty_buffer  # noqa: E402


def variants(L):
    def dus(make, each=lambda buf: buf):
        """The pieces written into make((L, ...)) one dynamic-update-slice each; each: what
        follows every write (an optimization barrier for dusEbar)."""
        def f(*xs):
            buf = make((L,) + xs[0].shape, xs[0].dtype)
            for i, x in enumerate(xs):
                buf = each(jax.lax.dynamic_update_slice_in_dim(buf, x[None], i, 0))
            return buf
        return f

    return {
        "stack": lambda *xs: jnp.stack(xs),
        "flat": lambda *xs: jnp.concatenate([x.reshape(-1) for x in xs]).reshape(
            (L,) + xs[0].shape),
        "dus0": dus(jnp.zeros),
        "dusE": dus(empty_buffer),
        "dusB": dus(lambda shape, dt: jax.lax.optimization_barrier(jnp.zeros(shape, dt))),
        "dusEbar": dus(empty_buffer, jax.lax.optimization_barrier),
    }


def timed(fn, args, reps):
    out = fn(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        out = fn(*args)
        jax.block_until_ready(out)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=24)
    ap.add_argument("--rows", type=int, default=2048)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--computed", action="store_true")
    a = ap.parse_args()
    if a.computed:
        return computed(a)
    L, shape = a.layers, (a.rows, a.cols)
    keys = jax.random.split(jax.random.key(0), L)
    xs = [jax.random.normal(k, shape, jnp.float32) for k in keys]
    nbytes = 2 * L * a.rows * a.cols * 4
    ref = jnp.stack(xs)
    for name, fn in variants(L).items():
        f = jax.jit(fn)
        ok = bool(jnp.array_equal(f(*xs), ref))
        s = timed(f, xs, a.reps)
        print(json.dumps({"variant": name, "ms": round(s * 1e3, 3),
                          "tb_per_s": round(nbytes / s / 1e12, 2), "equal": ok,
                          "device": jax.devices()[0].device_kind}), flush=True)
    s = timed(jax.jit(lambda x: x + 0), [ref], a.reps)
    print(json.dumps({"variant": "copy", "ms": round(s * 1e3, 3),
                      "tb_per_s": round(nbytes / s / 1e12, 2)}), flush=True)


def computed(a, k=256):
    """The pieces as float32 GEMM outputs inside the jit: (rows, k) @ (k, cols) each."""
    L = a.layers
    keys = jax.random.split(jax.random.key(1), 2 * L)
    lhs = [jax.random.normal(keys[i], (a.rows, k), jnp.bfloat16) for i in range(L)]
    rhs = [jax.random.normal(keys[L + i], (k, a.cols), jnp.bfloat16) for i in range(L)]
    gemm = lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32)
    cases = {"gemms": lambda *xs: tuple(xs)}
    cases.update({n: v for n, v in variants(L).items() if n in ("stack", "dusE", "dusEbar")})
    for name, fn in cases.items():
        f = jax.jit(lambda ls, rs, fn=fn: fn(*[gemm(x, y) for x, y in zip(ls, rs)]))
        s = timed(f, (lhs, rhs), a.reps)
        print(json.dumps({"variant": f"computed-{name}", "ms": round(s * 1e3, 3),
                          "device": jax.devices()[0].device_kind}), flush=True)


if __name__ == "__main__":
    main()
