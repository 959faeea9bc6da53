"""Does XLA:GPU add a weight gradient into its float32 accumulator inside the GEMM (cuBLAS
beta = 1), or in a separate pass? Issue 8's pipeline makes m such sums a step per weight.

    PYTHONPATH=. python benchmarks/gemm_accumulate.py [--m 16] [--tokens 2048] [--k 2048] [--n 8192]

For each form of the accumulation (plain, in a loop, in a loop through a conditional, and the
dot written against a transposed accumulator) prints one JSON line: time per microbatch (ms),
the same loop's time with the GEMM alone (no accumulate), the GEMM custom calls of the compiled
HLO with their beta, and the fusions that read the accumulator. Run it with
XLA_FLAGS=--xla_gpu_enable_cublaslt=true too (cuBLASLt takes a float32 C with bf16 A, B)."""
from __future__ import annotations

import argparse
import json
import re
import time

import jax
import jax.numpy as jnp
import numpy as np

from ptdp_jax.models.dense import weight_grad


def _time(f, acc_shape, *args, reps=5):
    """Median seconds of f(acc, *args), a fresh (donated) accumulator each call."""
    ts = []
    for _ in range(reps + 1):
        acc = jax.block_until_ready(jnp.zeros(acc_shape, jnp.float32))
        t = time.perf_counter()
        jax.block_until_ready(f(acc, *args))
        ts.append(time.perf_counter() - t)
    return float(np.median(ts[1:]))


def _gemms(text: str) -> list[str]:
    """custom_call_target and beta of every GEMM call in the compiled HLO."""
    out = []
    for line in text.splitlines():
        m = re.search(r'custom_call_target="([^"]*(?:gemm|matmul)[^"]*)"', line)
        if m:
            beta = re.search(r'"beta":\s*([0-9.e+-]+)', line)
            out.append(f"{m.group(1)} beta={beta.group(1) if beta else '?'}")
    out += [f"triton:{n}" for n in re.findall(r"%(gemm_fusion_dot\S*) = ", text)]
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--m", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--k", type=int, default=2048)
    ap.add_argument("--n", type=int, default=8192)
    a = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    bf = jnp.bfloat16
    xs = jnp.asarray(rng.standard_normal((a.m, 1, a.tokens, a.k)), bf)      # (m, b, s, k)
    gs = jnp.asarray(rng.standard_normal((a.m, 1, a.tokens, a.n)), bf)      # (m, b, s, n)
    acc0 = jnp.zeros((a.k, a.n), jnp.float32)

    def loop(body):
        def f(acc, xs, gs):
            return jax.lax.fori_loop(0, a.m, lambda i, c: body(i, c, xs[i], gs[i]), acc)
        return jax.jit(f, donate_argnums=0)

    forms = {
        "loop_add": lambda i, acc, x, g: acc + weight_grad(x, g),
        "loop_gemm_only": lambda i, acc, x, g: weight_grad(x, g) + acc[0, 0],
        "loop_cond_add": lambda i, acc, x, g: jax.lax.cond(
            i % 2 == 0, lambda c: c + weight_grad(x, g), lambda c: c + 2 * weight_grad(x, g), acc),
        "loop_add_bf16_out": lambda i, acc, x, g: acc + jax.lax.dot_general(
            x, g, (((0, 1), (0, 1)), ((), ()))).astype(jnp.float32),
        "loop_add_transposed": lambda i, acc, x, g: acc + jax.lax.dot_general(
            g, x, (((0, 1), (0, 1)), ((), ())), preferred_element_type=jnp.float32).T,
    }
    flops = 2 * a.tokens * a.k * a.n
    for name, body in forms.items():
        f = loop(body)
        try:
            text = f.lower(acc0, xs, gs).compile().as_text()
            t = _time(f, acc0.shape, xs, gs) / a.m
        except Exception as e:   # noqa: BLE001  (a form the backend cannot run)
            print(json.dumps({"form": name, "error": str(e)[:200]}), flush=True)
            continue
        print(json.dumps({"form": name, "ms_per_microbatch": round(t * 1e3, 4),
                          "tflops": round(flops / t / 1e12, 1), "gemms": _gemms(text),
                          "device": jax.devices()[0].device_kind}), flush=True)


if __name__ == "__main__":
    main()
