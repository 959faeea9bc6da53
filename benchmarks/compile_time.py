"""Compile time and compiled temporary memory of the train step, without running it.

    PYTHONPATH=. python benchmarks/compile_time.py configs/bench-1.3b.yaml --mesh 1,4,1 \
        --m 8,64 parallel.schedule=1f1b train.micro_batch_size=2

For each m, sets train.global_batch_size = m * micro_batch_size * d and prints one JSON
line: lower and compile seconds, and memory_analysis() temp/argument bytes per device.
Compile time must not grow with m (the pipeline is a scan over ticks)."""
from __future__ import annotations

import argparse
import json
import time

import jax
import numpy as np


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--m", required=True, help="comma-separated microbatch counts, e.g. 8,64")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_intermixed_args(argv)
    from ptdp_jax.config.load import parse_cli_overrides
    from ptdp_jax.config.validation import validate
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import make_optimizer
    from ptdp_jax.training.step import compile_all
    from ptdp_jax.run.loop import resolve_config

    mesh_shape = tuple(int(x) for x in a.mesh.split(","))
    for m in (int(x) for x in a.m.split(",")):
        ov = parse_cli_overrides(a.overrides)
        cfg = resolve_config(a.config, mesh_shape, ov)
        B = m * cfg.train.micro_batch_size * cfg.parallel.data
        cfg = resolve_config(cfg, None, {"train.global_batch_size": B})
        validate(cfg, len(jax.devices()))
        mesh = make_mesh(cfg.parallel.mesh_dims)
        tx, _ = make_optimizer(cfg)
        c = compile_all(cfg, mesh, tx)
        state = jax.eval_shape(c.init)
        state = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
                             state, c.shardings)
        batch = jax.ShapeDtypeStruct((B, cfg.model.seq_len + 1), np.int32)
        t0 = time.perf_counter()
        lowered = c.step.lower(state, batch)
        t1 = time.perf_counter()
        exe = lowered.compile()
        t2 = time.perf_counter()
        mem = exe.memory_analysis()
        print(json.dumps({
            "mesh": list(mesh_shape), "schedule": cfg.parallel.schedule, "v": cfg.parallel.virtual_stages,
            "m": cfg.num_microbatches, "recompute": cfg.train.recompute,
            "lower_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
            "temp_gib": round(mem.temp_size_in_bytes / 2**30, 3) if mem else None,
            "argument_gib": round(mem.argument_size_in_bytes / 2**30, 3) if mem else None,
            "device": jax.devices()[0].device_kind}), flush=True)


if __name__ == "__main__":
    main()
