"""Can the tensor ring's permutes run inside a pipeline's per-stage branches? A probe before
anything relies on it (issue 11: validation refuses parallel.tp_comm_overlap with pipe > 1,
on the grounds that a permute over 'tensor' inside a lax.switch spans every stage's tensor
group while the stages run different branches).

    PYTHONPATH=. python benchmarks/branch_permute_probe.py [--peer] [--idle] [--warmup]
        [--rows 4096] [--ticks 8]

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
--idle makes that meeting as the step does (branch 1 without a permute, a 'pipe' all-reduce
after the switch): expected to hang on GPUs. --warmup first runs a table in which every stage
takes the same branch at each tick (the branch table is an input, so the same executable
runs it), making every collective's first call together: if the divergent run after it
completes, a warm-up run is a way to the ring inside the pipeline.

Measured (session 36, 4x H200): --idle hangs; --idle --warmup runs and matches on NCCL; with
--peer the idle pattern runs but gives wrong results (warm-up or not). So only NCCL's permutes
are right there, and on them the ring is slower than no ring (benchmarks/NOTES.md).
"""
from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.sharding import make_mesh, shift_pairs
from ptdp_jax.step import PERMUTE_PEER_MODE


def divergent(ticks, p=2):
    """The branch table (ticks, p): stage s runs branch (s + tick) % 2, never its neighbour's."""
    return np.array([[(s + i) % 2 for s in range(p)] for i in range(ticks)], np.int32)


def uniform(ticks, p=2):
    """Every stage runs branch tick % 2: each collective's first call made by all together."""
    return np.array([[i % 2] * p for i in range(ticks)], np.int32)


def expected(x, table, idle=False):
    """numpy: x (p, t, rows, cols) through the table's ticks."""
    x = x.copy()
    for row in table:
        y = np.empty_like(x)
        for s, branch in enumerate(row):
            if branch == 0:               # from tensor rank r - 1, times 0.5
                y[s] = 0.5 * np.roll(x[s], 1, axis=0)
            elif idle:                    # plus 1, no permute
                y[s] = x[s] + 1.0
            else:                         # from tensor rank r + 1, plus 1
                y[s] = np.roll(x[s], -1, axis=0) + 1.0
        x = np.roll(y, 1, axis=0)         # stage s receives stage s - 1's block
    return x


def program(mesh, idle=False):
    """f(x, table): the ticks of `table` (ticks, p), a traced input, so that one executable
    runs any table. idle: branch 1 without a permute, and a 'pipe' all-reduce after the
    switch (of a zero-weighted element), as the train step's stage that idles meets the other
    in a 'pipe' collective."""
    t, p = mesh.shape["tensor"], mesh.shape["pipe"]
    fwd, back, ring = shift_pairs(t, 1), shift_pairs(t, -1), shift_pairs(p, 1)
    other = (lambda a: a + 1.0) if idle else (lambda a: jax.lax.ppermute(a, "tensor", back) + 1.0)

    def run(x, table):
        def body(i, x):
            branch = table[i, jax.lax.axis_index("pipe")]
            x = jax.lax.switch(branch, [lambda a: 0.5 * jax.lax.ppermute(a, "tensor", fwd),
                                        other], x)
            if idle:
                x = x + 0.0 * jax.lax.psum(x[0, 0], "pipe")
            return jax.lax.ppermute(x, "pipe", ring)
        return jax.lax.fori_loop(0, table.shape[0], body, x)

    spec = P("pipe", "tensor")
    return jax.shard_map(run, mesh=mesh, in_specs=(spec, P()), out_specs=spec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer", action="store_true")
    ap.add_argument("--idle", action="store_true", help="branch 1 without a permute, then a "
                    "'pipe' all-reduce (the train step's pattern)")
    ap.add_argument("--warmup", action="store_true", help="first run a uniform table")
    ap.add_argument("--rows", type=int, default=4096)
    ap.add_argument("--ticks", type=int, default=8)
    a = ap.parse_args(argv)
    mesh = make_mesh((1, 2, 2))
    x = np.random.default_rng(0).standard_normal((2, 2, a.rows, 256)).astype(np.float32)
    opts = {"xla_gpu_collective_permute_mode": PERMUTE_PEER_MODE} if a.peer else None
    f = jax.jit(program(mesh, a.idle), compiler_options=opts)
    xd = jax.device_put(x.reshape(2, 2 * a.rows, 256), NamedSharding(mesh, P("pipe", "tensor")))
    table = divergent(a.ticks)
    if a.warmup:
        jax.block_until_ready(f(xd, uniform(a.ticks)))
    out = np.asarray(f(xd, table)).reshape(x.shape)
    t0 = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(f(xd, table))
    ms = (time.perf_counter() - t0) / 5 * 1e3
    err = float(np.abs(out - expected(x, table, a.idle)).max())
    print(json.dumps({"peer": a.peer, "idle": a.idle, "warmup": a.warmup, "ticks": a.ticks,
                      "ok": err < 1e-5, "max_err": err, "ms": round(ms, 3),
                      "device": jax.devices()[0].device_kind}))
    return 0 if err < 1e-5 else 1


if __name__ == "__main__":
    raise SystemExit(main())
