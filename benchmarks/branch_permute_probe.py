"""Can the tensor ring's permutes run inside a pipeline's per-stage branches? A probe before
anything relies on it (issue 11: validation refuses parallel.tp_comm_overlap with pipe > 1,
on the grounds that a permute over 'tensor' inside a lax.switch spans every stage's tensor
group while the stages run different branches).

    PYTHONPATH=. python benchmarks/branch_permute_probe.py [--peer] [--rows 4096] [--ticks 8]

On a (1, 2, 2) ('data', 'pipe', 'tensor') mesh, a shard_map manual over every axis runs
`--ticks` ticks of a loop: each stage picks its branch by (stage + tick) % 2, so the two
stages run different branches in every tick; branch 0 sends a block one way round the tensor
group and multiplies, branch 1 sends it the other way and adds (different permutes in
different branches); after the switch the stages swap their blocks over 'pipe', as a
pipeline's stage permute does. The result is checked against the same arithmetic in numpy.
--peer compiles with XLA's peer mode for permutes (the copy engines, as step.compiler_options
sets for the ring). Prints one JSON line: ok, max error, ms a run; a hang is a deadlock (run
it under `timeout`).

Measured (session 35, 4x H200): runs and matches in both modes. But the 1.3B (1,2,2) train
step with the ring in its branches hung at its first run: XLA:GPU meets the participants of
each collective's clique once after its first call, the ring's permutes' clique is all four
GPUs, and a stage held there while the other waits in a 'pipe' all-reduce's meeting never
meets it (benchmarks/NOTES.md, session 35). Here the two stages' first permutes share a
clique, so they meet; the probe shows the permutes themselves, not the first-call meeting.
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.sharding import make_mesh
from ptdp_jax.step import PERMUTE_PEER_MODE


def expected(x, ticks):
    """numpy: x (p, t, rows, cols), the same ticks."""
    p, t = x.shape[:2]
    x = x.copy()
    for i in range(ticks):
        y = np.empty_like(x)
        for s in range(p):
            if (s + i) % 2 == 0:          # branch 0: from tensor rank r - 1, times 0.5
                y[s] = 0.5 * np.roll(x[s], 1, axis=0)
            else:                         # branch 1: from tensor rank r + 1, plus 1
                y[s] = np.roll(x[s], -1, axis=0) + 1.0
        x = np.roll(y, 1, axis=0)         # stage s receives stage s - 1's block
    return x


def program(mesh, ticks):
    t = mesh.shape["tensor"]
    fwd = [(r, (r + 1) % t) for r in range(t)]
    back = [(r, (r - 1) % t) for r in range(t)]
    p = mesh.shape["pipe"]
    ring = [(s, (s + 1) % p) for s in range(p)]

    def body(i, x):
        stage = jax.lax.axis_index("pipe")
        x = jax.lax.switch((stage + i) % 2, [
            lambda a: 0.5 * jax.lax.ppermute(a, "tensor", fwd),
            lambda a: jax.lax.ppermute(a, "tensor", back) + 1.0], x)
        return jax.lax.ppermute(x, "pipe", ring)

    def run(x):
        return jax.lax.fori_loop(0, ticks, body, x)

    spec = P("pipe", "tensor")
    return jax.shard_map(run, mesh=mesh, in_specs=spec, out_specs=spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--ticks", type=int, default=8)
    a = ap.parse_args(argv)
    mesh = make_mesh((1, 2, 2))
    x = np.random.default_rng(0).standard_normal((2, 2, a.rows, 256)).astype(np.float32)
    opts = {"xla_gpu_collective_permute_mode": PERMUTE_PEER_MODE} if a.peer else None
    f = jax.jit(program(mesh, a.ticks), compiler_options=opts)
    xd = jax.device_put(x.reshape(2, 2 * a.rows, 256), NamedSharding(mesh, P("pipe", "tensor")))
    out = np.asarray(f(xd)).reshape(x.shape)              # compiles and runs once
    t0 = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(f(xd))
    ms = (time.perf_counter() - t0) / 5 * 1e3
    err = float(np.abs(out - expected(x, a.ticks)).max())
    print(json.dumps({"peer": a.peer, "ticks": a.ticks, "ok": err < 1e-5, "max_err": err,
                      "ms": round(ms, 3), "device": jax.devices()[0].device_kind}))
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
