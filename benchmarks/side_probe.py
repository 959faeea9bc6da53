"""Does an all-gather run beside an independent GEMM chain, and at what cost to each? A probe of
NCCL's CTA policies (NCCL_CTA_POLICY, 2.28: 1 efficiency, 2 zero: copy-engine collectives where
the buffers allow) before anything in the train step relies on them (issue 11, NOTES Session 30).

    PYTHONPATH=. python benchmarks/side_probe.py [--rows 16384] [--hidden 2048] [--ffn 8192]
        [--chain 8] [--gather-mib 32] [--trace DIR]

On a ('tensor',) mesh of every local device, three programs, each timed over 20 runs after 3
warm-ups:

    gemm     a chain of `--chain` MLP GEMM pairs on each device's own rows, no communication
    gather   `--chain` all-gathers of an independent bf16 array (`--gather-mib` MiB a device)
    both     the two in one program, with no dependency between them: the ideal is
             max(gemm, gather), serial is gemm + gather

Prints one JSON line per program, and a last line with both / (gemm + gather) and
both / max(gemm, gather). With --trace DIR each program is traced once and the line gets the
NCCL kernels' time, their exposed part and the GEMM time per device (overlap_probe.traced).
"""
from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from overlap_probe import traced   # benchmarks/ (this script's folder): NCCL and GEMM time a device


def programs(chain: int):
    """(name, function of (x, y, w1, w2)) per case; shard_map bodies over 'tensor'."""
    def gemms(x, w1, w2):
        for i in range(chain):
            x = x + jax.nn.gelu(x @ w1[i]) @ w2[i]
        return x

    def gathers(y):
        acc = jnp.zeros((1,), jnp.float32)
        for i in range(chain):
            g = jax.lax.all_gather(y + i, "tensor", tiled=True)    # y + i: no CSE of the gathers
            acc = acc + g[0, 0].astype(jnp.float32)
        return acc

    return {
        "gemm": lambda x, y, w1, w2: (gemms(x, w1, w2), jnp.zeros((1,), jnp.float32)),
        "gather": lambda x, y, w1, w2: (x, gathers(y)),
        "both": lambda x, y, w1, w2: (gemms(x, w1, w2), gathers(y)),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--chain", type=int, default=8)
    ap.add_argument("--gather-mib", type=int, default=32)
    ap.add_argument("--trace", default="")
    a = ap.parse_args(argv)
    t = jax.device_count()
    mesh = jax.make_mesh((t,), ("tensor",))
    k = jax.random.split(jax.random.key(0), 4)
    cols = 4096
    y_rows = a.gather_mib * 2 ** 20 // (2 * cols) * t
    x = jax.random.normal(k[0], (a.rows * t, a.hidden), jnp.bfloat16)
    y = jax.random.normal(k[1], (y_rows, cols), jnp.bfloat16)
    w1 = jax.random.normal(k[2], (a.chain, a.hidden, a.ffn), jnp.bfloat16) * 0.02
    w2 = jax.random.normal(k[3], (a.chain, a.ffn, a.hidden), jnp.bfloat16) * 0.02
    rows, rep = NamedSharding(mesh, P("tensor")), NamedSharding(mesh, P())
    x, y = jax.device_put(x, rows), jax.device_put(y, rows)
    w1, w2 = jax.device_put(w1, rep), jax.device_put(w2, rep)
    times = {}
    for name, body in programs(a.chain).items():
        f = jax.jit(jax.shard_map(body, mesh=mesh, in_specs=(P("tensor"), P("tensor"), P(), P()),
                                  out_specs=(P("tensor"), P("tensor"))))
        for _ in range(3):
            jax.block_until_ready(f(x, y, w1, w2))
        t0 = time.perf_counter()
        for _ in range(20):
            out = f(x, y, w1, w2)
        jax.block_until_ready(out)
        times[name] = (time.perf_counter() - t0) / 20 * 1e3
        line = {"case": name, "t": t, "ms": round(times[name], 4),
                "device": jax.devices()[0].device_kind,
                "cta_policy": os.environ.get("NCCL_CTA_POLICY", "")}
        if a.trace:
            line.update(traced(f, (x, y, w1, w2), os.path.join(a.trace, name)))
        print(json.dumps(line), flush=True)
    g, c, b = times["gemm"], times["gather"], times["both"]
    print(json.dumps({"case": "summary", "both_over_serial": round(b / (g + c), 3),
                      "both_over_ideal": round(b / max(g, c), 3),
                      "cta_policy": os.environ.get("NCCL_CTA_POLICY", "")}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
