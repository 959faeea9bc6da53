"""Bandwidth of the collectives a tensor-parallel layer runs, alone on the GPUs.

    PYTHONPATH=. python3 benchmarks/collective_bw.py [--mib 32 128] [--iters 20]

For each size (MiB a device holds before an all-gather, or after a reduce-scatter) it times
`--loop` bf16 all-gathers, each followed by a reduce-scatter of its output, in one compiled
loop over every local device (one axis, jax.shard_map; the host's dispatch is paid once), and
prints one JSON line: the time of one all-gather + reduce-scatter pair, the algorithm bandwidth
(bytes of the full array / half the pair's time) and NCCL's bus bandwidth (x (n - 1) / n), to
compare with the exposed collectives of a step (issue 11: are they at NVLink's rate, or is
there something left to tune?).
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P


def timed(fn, x, iters: int) -> float:
    fn(x).block_until_ready()                                     # compile, warm
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn(x).block_until_ready()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, nargs="+", default=[8, 32, 128])
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--loop", type=int, default=20, help="pairs in one compiled loop")
    a = ap.parse_args()
    n = jax.local_device_count()
    mesh = jax.make_mesh((n,), ("x",))
    def pairs(b):                                   # b: (rows, 4096) a device
        def body(_, b):
            full = jax.lax.all_gather(b, "x", tiled=True)            # (n rows, 4096)
            return jax.lax.psum_scatter(full, "x", tiled=True) * (1.0 / n)
        return jax.lax.fori_loop(0, a.loop, body, b)
    fn = jax.jit(jax.shard_map(pairs, mesh=mesh, in_specs=P("x"), out_specs=P("x"),
                               check_vma=False))
    for mib in a.mib:
        rows = mib * 2**20 // (2 * 4096)
        full = n * rows * 4096 * 2                                 # bytes of the gathered array
        x = jax.device_put(jnp.ones((n * rows, 4096), jnp.bfloat16), NamedSharding(mesh, P("x")))
        t = timed(fn, x, a.iters) / a.loop / 2                     # one collective
        print(json.dumps({"op": "all_gather+reduce_scatter", "devices": n, "shard_mib": mib,
                          "loop": a.loop, "time_ms_each": round(1e3 * t, 3),
                          "algbw_gbs": round(full / t / 1e9, 1),
                          "busbw_gbs": round(full / t / 1e9 * (n - 1) / n, 1),
                          "device": jax.devices()[0].device_kind}), flush=True)


if __name__ == "__main__":
    main()
