"""Time training steps of a config on the devices at hand.

    PYTHONPATH=. python benchmarks/bench_train.py configs/bench-1.3b.yaml --steps 12 \
        [--mesh 1,1,1] [key=value ...]

Prints one JSON line per run: median (and mean) step time (after the compile step and
`--skip` more, and without the last), tokens/s, model TFLOP/s per device (the paper's formula, no
recomputation counted), MFU against the device's peak, peak device memory,
and the first-step (compile) time. The config runs as ptdp-train runs it (train(): no layout
keys, or only --mesh, and the planner picks or fills in the layout on GPUs); the figures and
the layout printed are those that ran, with where the layout came from and the planner's
prediction of it."""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import jax


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--mesh")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--skip", type=int, default=2, help="steps after the first left out of the median")
    ap.add_argument("--tag", default="")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_intermixed_args(argv)

    from ptdp_jax.config.memory_limit import use_planned_fraction
    use_planned_fraction()          # the memory limit ptdp-train runs with, before jax's backend
    from ptdp_jax.training import metrics as MX
    from ptdp_jax.config.load import parse_cli_overrides
    from ptdp_jax.run.loop import train

    ov = parse_cli_overrides(a.overrides)
    ov.update({"train.steps": a.steps, "train.eval_every": 0, "train.sample_tokens": 0,
               "checkpoint.dir": ""})
    mesh = tuple(int(x) for x in a.mesh.split(",")) if a.mesh else None
    t0 = time.time()
    res = train(a.config, mesh_shape=mesh, overrides=ov, log=lambda *x, **k: None)
    wall = time.time() - t0
    cfg = res.config                 # as it ran: dtype, layout and recompute resolved
    # the last step is left out too: where a step's dispatch returns late (a loop over
    # microbatches), the loop reads the step before late, and the last interval comes out short
    times = res.step_times[1 + a.skip:-1] or res.step_times
    dt = statistics.median(times)
    n = cfg.parallel.data * cfg.parallel.pipe * cfg.parallel.tensor
    flops = MX.model_flops_per_iteration(cfg, False, res.attention_share)
    peak = MX.peak_flops_per_device(jax.devices()[0])
    mem = [d.memory_stats() or {} for d in jax.devices()[:n]]
    out = {
        "tag": a.tag, "config": a.config, "overrides": a.overrides,
        "device": jax.devices()[0].device_kind,
        "mesh": list(cfg.parallel.mesh_shape), "schedule": cfg.parallel.schedule,
        "v": cfg.parallel.virtual_stages, "m": cfg.num_microbatches,
        "micro_batch": cfg.train.micro_batch_size, "global_batch": cfg.train.global_batch_size,
        "recompute": cfg.train.recompute, "dtype": cfg.train.dtype, "zero": cfg.parallel.zero,
        "sequence_parallel": cfg.parallel.sequence_parallel,
        "scatter_gather": cfg.parallel.scatter_gather,
        "grad_reduce_dtype": cfg.parallel.grad_reduce_dtype, "layout": res.layout,
        "predicted_step_s": res.predicted_step_s,
        "step_time_s": round(dt, 4), "step_time_min_s": round(min(times), 4),
        "step_time_mean_s": round(statistics.fmean(times), 4),
        "tokens_per_s": round(cfg.train.global_batch_size * cfg.model.seq_len / dt, 1),
        "tflops_per_device": round(flops / dt / n / 1e12, 2),
        "mfu": round(flops / dt / n / peak, 4) if peak else None,
        "first_step_s": round(res.step_times[0], 2), "wall_s": round(wall, 1),
        "peak_mem_gib": [round(m.get("peak_bytes_in_use", 0) / 2**30, 2) for m in mem],
        "final_loss": round(res.losses[-1], 4),
    }
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
