"""Does XLA on this GPU run a collective-permute under an independent GEMM? A probe before
building a decomposed collective matmul for sequence parallelism (issue 11).

    PYTHONPATH=. python benchmarks/overlap_probe.py [--rows 8192] [--hidden 2048] [--ffn 8192]

On a ('tensor',) mesh of every local device (t of them), shapes of one 1.3B layer at micro 4
(rows = b s tokens). Each case is an MLP block under sequence parallelism, 8 in a chain (the
output of one is the input of the next), timed over 20 runs after 3 warm-ups:

    gemm      the same GEMMs on one device's share without any communication (the floor)
    plain     all_gather -> GEMM -> GeLU -> GEMM -> psum_scatter (what GSPMD emits)
    ring      the all-gather and the reduce-scatter decomposed into t - 1 ppermute steps, each
              step's send independent of the GEMM on the block at hand (collective matmul)
    direct    the same GEMMs, each block sent straight to every rank at once and each partial
              sum straight to its owner (parallel.tp_overlap_sends=direct): no chained hops

If ring is near gemm, the permutes run under the GEMMs; if it is near plain or above, they
do not. Prints one JSON line per case. With --trace DIR each case is also traced once and the
line gets, per device, the NCCL kernels' time, the part of it no GEMM or other kernel hides
(`ptdp_jax.profiling`'s exclusive timeline), and the CUDA streams the NCCL and GEMM kernels
ran on. With --hlo DIR each case's optimized HLO goes to DIR/CASE.txt (the schedule: what
runs between a collective's start and its done).
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P


def ring_gather_matmul(x_blk, w, t):
    """AG(x) @ w, as t blocks: block (r - i) mod t's GEMM while the next block travels."""
    r = jax.lax.axis_index("tensor")
    perm = [(i, (i + 1) % t) for i in range(t)]
    out = jnp.zeros((t,) + x_blk.shape[:-1] + w.shape[-1:], x_blk.dtype)
    cur = x_blk
    for i in range(t):
        nxt = jax.lax.ppermute(cur, "tensor", perm) if i < t - 1 else None
        out = jax.lax.dynamic_update_index_in_dim(out, cur @ w, (r - i) % t, 0)
        cur = nxt
    return out.reshape((-1,) + out.shape[2:])


def ring_matmul_scatter(z, w, t):
    """psum_scatter(z @ w) over rows, as t blocks: the partial sum of block (r + i + 1) mod t
    travels while the next block's GEMM runs; rank r ends with block r."""
    r = jax.lax.axis_index("tensor")
    perm = [(i, (i - 1) % t) for i in range(t)]
    zb = z.reshape((t, -1) + z.shape[1:])
    acc = None
    for i in range(t):
        blk = jax.lax.dynamic_index_in_dim(zb, (r + i + 1) % t, 0, keepdims=False) @ w
        acc = blk if acc is None else acc + blk
        if i < t - 1:
            acc = jax.lax.ppermute(acc, "tensor", perm)
    return acc


def _shift(t, k):
    return [(i, (i + k) % t) for i in range(t)]


def direct_gather_matmul(x_blk, w, t):
    """AG(x) @ w, every block sent straight to every rank (shift k), each GEMM on arrival."""
    r = jax.lax.axis_index("tensor")
    blocks = [x_blk] + [jax.lax.ppermute(x_blk, "tensor", _shift(t, k)) for k in range(1, t)]
    out = jnp.zeros((t,) + x_blk.shape[:-1] + w.shape[-1:], x_blk.dtype)
    for j, b in enumerate(blocks):                    # blocks[j]: rank r - j's
        out = jax.lax.dynamic_update_index_in_dim(out, b @ w, (r - j) % t, 0)
    return out.reshape((-1,) + out.shape[2:])


def direct_matmul_scatter(z, w, t):
    """psum_scatter(z @ w) over rows: the partial sum of block r + k sent straight to rank
    r + k as soon as its GEMM is done; rank r adds the t parts of block r."""
    r = jax.lax.axis_index("tensor")
    zb = z.reshape((t, -1) + z.shape[1:])
    part = lambda j: jax.lax.dynamic_index_in_dim(zb, j % t, 0, keepdims=False) @ w
    sent = [jax.lax.ppermute(part(r + k), "tensor", _shift(t, k)) for k in range(1, t)]
    acc = part(r)
    for p in sent:
        acc = acc + p
    return acc


def block(kind, t):
    def mlp(x, w1, w2):
        if kind == "gemm":
            full = jnp.concatenate([x] * t, 0)
            return (jax.nn.gelu(full @ w1) @ w2)[: x.shape[0]]
        if kind == "plain":
            full = jax.lax.all_gather(x, "tensor", tiled=True)
            return jax.lax.psum_scatter(jax.nn.gelu(full @ w1) @ w2, "tensor", tiled=True)
        if kind == "direct":
            return direct_matmul_scatter(jax.nn.gelu(direct_gather_matmul(x, w1, t)), w2, t)
        return ring_matmul_scatter(jax.nn.gelu(ring_gather_matmul(x, w1, t)), w2, t)
    return mlp


def traced(f, args, folder):
    """NCCL time, its exposed part, and the streams of NCCL and GEMM kernels, per device."""
    from ptdp_jax import profiling as prof
    with jax.profiler.trace(folder, create_perfetto_trace=True):
        jax.block_until_ready(f(*args))
    path = sorted(glob.glob(os.path.join(folder, "**", "perfetto_trace.json.gz"), recursive=True))[-1]
    out = {}
    for dev, ks in prof.load_trace(path).items():
        start, end = ks[0].ts_us, max(k.end_us for k in ks)
        cats = prof.category_time_us(prof.exclusive_timeline(ks, start, end), start, end)
        nccl = [k for k in ks if prof.classify(k) == "collective"]
        out[f"gpu{dev}"] = {
            "window_ms": round((end - start) / 1e3, 3),
            "nccl_ms": round(sum(k.dur_us for k in nccl) / 1e3, 3),
            "nccl_exposed_ms": round(cats["collective"] / 1e3, 3),
            "gemm_ms": round(cats["gemm"] / 1e3, 3),
            "nccl_streams": sorted({k.stream for k in nccl}),
            "gemm_streams": sorted({k.stream for k in ks if prof.classify(k) == "gemm"})}
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--chain", type=int, default=8)
    ap.add_argument("--trace", default="", help="trace each case once into this folder")
    ap.add_argument("--hlo", default="", help="write each case's optimized HLO into this folder")
    ap.add_argument("--dot-merger", action="store_true",
                    help="leave XLA's dot merger on (the train step turns it off, step.compiler_options)")
    a = ap.parse_args(argv)
    t = jax.device_count()
    mesh = jax.make_mesh((t,), ("tensor",))
    k = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(k[0], (a.rows, a.hidden), jnp.bfloat16)
    w1 = jax.random.normal(k[1], (a.chain, a.hidden, a.ffn), jnp.bfloat16) * 0.02
    w2 = jax.random.normal(k[2], (a.chain, a.ffn, a.hidden), jnp.bfloat16) * 0.02
    x = jax.device_put(x, NamedSharding(mesh, P("tensor")))
    w1 = jax.device_put(w1, NamedSharding(mesh, P(None, None, "tensor")))
    w2 = jax.device_put(w2, NamedSharding(mesh, P(None, "tensor")))
    ref = None
    for kind in ("gemm", "plain", "ring", "direct"):
        mlp = block(kind, t)

        def chain(x, w1, w2, mlp=mlp):
            for i in range(a.chain):
                x = x + mlp(x, w1[i], w2[i])
            return x
        # as the train step: without it XLA merges the ring's two GEMMs of one weight back into
        # one GEMM over the concatenated blocks, which waits for the permute (session 13)
        opts = {} if a.dot_merger or jax.default_backend() != "gpu" else \
            {"xla_gpu_dot_merger_threshold_mb": 0}
        f = jax.jit(jax.shard_map(chain, mesh=mesh, in_specs=(P("tensor"), P(None, None, "tensor"),
                                                            P(None, "tensor")),
                                  out_specs=P("tensor")), compiler_options=opts or None)
        if a.hlo:
            os.makedirs(a.hlo, exist_ok=True)
            with open(os.path.join(a.hlo, f"{kind}.txt"), "w") as fh:
                fh.write(f.lower(x, w1, w2).compile().as_text())
        for _ in range(3):
            out = f(x, w1, w2).block_until_ready()
        t0 = time.perf_counter()
        for _ in range(20):
            out = f(x, w1, w2)
        out.block_until_ready()
        ms = (time.perf_counter() - t0) / 20 * 1e3
        if kind == "plain":
            ref = out
        diff = rel = None
        if ref is not None and kind in ("ring", "direct"):
            # bf16 sums in another order: t = 2 adds two terms (exact), t = 4 does not, and the
            # chain's residual stream grows to hundreds, where one bf16 step is 2-4
            err = jnp.abs(out.astype(jnp.float32) - ref.astype(jnp.float32))
            diff = float(jnp.max(err))
            rel = float(jnp.max(err) / jnp.max(jnp.abs(ref.astype(jnp.float32))))
        line = {"case": kind, "t": t, "ms": round(ms, 3), "max_abs_diff_vs_plain": diff,
                "max_diff_over_max_abs": rel, "device": jax.devices()[0].device_kind}
        if a.trace:
            line.update(traced(f, (x, w1, w2), os.path.join(a.trace, kind)))
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
