"""Compile a config's train step, time it, and trace one step with jax.profiler.

    PYTHONPATH=. python benchmarks/capture_step.py configs/bench-1.3b.yaml --mesh 1,4,1 \
        --trace-dir /tmp/trace [--steps 6] [--hlo-dir DIR] [key=value ...]

Synthetic tokens (uniform over the vocabulary), so no dataset is read. Prints one JSON
line: median step time over `--steps` timed steps after two warm-up steps, peak memory
per device, the loss of the last timed step (a traced step runs after it, so traced and
untraced runs report the same step's loss), and where the trace (perfetto_trace.json.gz)
was written. With `--hlo-dir` the optimized HLO of the step is written there too.
`--trace-steps 2` traces two steps, so that `profile_step.py --trace-steps 2` can read the
second, which the profiler's start does not skew. `benchmarks/profile_step.py` runs this and
then reads the trace by category."""
from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time


def _override_options(values: dict) -> None:
    """Replace some of the XLA options that step.compiler_options gives the train step (an
    A/B only): each key's value, or with None left out (XLA's own default). Off GPU there are
    none to replace."""
    from ptdp_jax.training import step as step
    base = step.compiler_options

    def options(cfg, mesh):
        o = base(cfg, mesh)
        if o:                                    # o is empty off GPU
            for key, value in values.items():
                o.pop(key, None)
                if value is not None:
                    o[key] = value
        return o
    step.compiler_options = options


def _combine_options(ag_mib: int, rs_mib: int) -> dict:
    """--combine-mib AG,RS: the all-gather and reduce-scatter combine thresholds (0: XLA's)."""
    return {key: mib * 2 ** 20 if mib else None
            for key, mib in (("xla_gpu_all_gather_combine_threshold_bytes", ag_mib),
                             ("xla_gpu_reduce_scatter_combine_threshold_bytes", rs_mib))}


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--mesh", required=True)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--trace-dir", default="")
    ap.add_argument("--trace-steps", type=int, default=1,
                    help="steps inside the trace; profile_step.py --trace-steps N reads the last")
    ap.add_argument("--trace-host-level", type=int, default=None,
                    help="jax.profiler host and Python tracer level (default: jax's, host 2 and "
                         "Python 1); 0 traces the device only (a traced pipeline step ran 2.2x "
                         "its untraced time, 4x H200, 2026-11-27)")
    ap.add_argument("--hlo-dir", default="")
    ap.add_argument("--back-to-back", action="store_true",
                    help="trace the steps as the timed loop runs them (only the loss waited for, "
                         "no pause): the GPUs' idle time between steps shows; profile_step.py "
                         "reads such a trace with --back-to-back")
    ap.add_argument("--combine-mib", default="",
                    help="AG,RS: XLA's all-gather and reduce-scatter combine thresholds in MiB "
                         "instead of step.compiler_options' (0: XLA's own default); an A/B only")
    ap.add_argument("--permute-mode", choices=("nccl", "peer"), default=None,
                    help="XLA's collective-permute mode instead of step.compiler_options' "
                         "(nccl: NCCL's kernels, XLA's default; peer: copy-engine copies)")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_intermixed_args(argv)

    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec as P

    from ptdp_jax.config.load import parse_cli_overrides
    from ptdp_jax.config.validation import validate
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import make_optimizer
    from ptdp_jax.training.fp8_state import READY_METRIC
    from ptdp_jax.training.step import compile_all
    from ptdp_jax.run.loop import resolve_config

    from ptdp_jax.config.decisions import PERMUTE_PEER_MODE
    if a.combine_mib:
        _override_options(_combine_options(*(int(x) for x in a.combine_mib.split(","))))
    if a.permute_mode:                   # nccl: XLA's default mode (NCCL's kernels)
        _override_options({"xla_gpu_collective_permute_mode":
                           PERMUTE_PEER_MODE if a.permute_mode == "peer" else None})
    mesh_shape = tuple(int(x) for x in a.mesh.split(","))
    cfg = validate(resolve_config(a.config, mesh_shape, parse_cli_overrides(a.overrides)),
                   len(jax.devices()))
    mesh = make_mesh(cfg.parallel.mesh_dims)
    tx, _ = make_optimizer(cfg)
    c = compile_all(cfg, mesh, tx)
    state = c.init()
    rng = np.random.default_rng(0)
    B, s = cfg.train.global_batch_size, cfg.model.seq_len
    batch_sh = NamedSharding(mesh, P("data"))
    batches = [jax.device_put(rng.integers(0, cfg.model.vocab_size, (B, s + 1)).astype(np.int32),
                              batch_sh) for _ in range(2)]
    t0 = time.perf_counter()
    if a.hlo_dir:
        os.makedirs(a.hlo_dir, exist_ok=True)
        text = c.step.lower(state, batches[0]).compile().as_text()
        with open(os.path.join(a.hlo_dir, "step_after_optimizations.txt"), "w") as f:
            f.write(text)
    state, out = c.step(state, batches[0])
    float(out["loss"])
    first = time.perf_counter() - t0
    step = c.step          # delayed FP8 scaling: its steady step once the history is full
    if c.steady_step is not None and bool(out[READY_METRIC]):
        step = c.steady_step
    times = []
    for i in range(1 + a.steps):
        t0 = time.perf_counter()
        state, out = step(state, batches[i % 2])
        float(out["loss"])
        times.append(time.perf_counter() - t0)
    times = times[1:]
    final_loss = float(out["loss"])      # of the last timed step: the same with or without a trace
    t0 = time.perf_counter()                 # the same steps queued without a wait between them:
    for i in range(a.steps):                 # the host's time between two steps (the loss read,
        state, out = step(state, batches[i % 2])   # the next dispatch) is then hidden
    jax.block_until_ready((state, out))
    queued = (time.perf_counter() - t0) / a.steps
    trace = None
    if a.trace_dir:
        opts = None
        if a.trace_host_level is not None:
            opts = jax.profiler.ProfileOptions()
            opts.host_tracer_level = opts.python_tracer_level = a.trace_host_level
        with jax.profiler.trace(a.trace_dir, create_perfetto_trace=True, profiler_options=opts):
            for _ in range(a.trace_steps):       # each waited for: a gap between them
                state, out = step(state, batches[0])
                if a.back_to_back:
                    float(out["loss"])
                    continue
                # the whole state, not only the loss (ready on some devices before the update
                # ends on all: at p = 4 no idle gap was left between two traced steps),
                # then a pause every device idles through, where profiling.last_run cuts
                jax.block_until_ready((state, out))
                time.sleep(0.1)
            jax.block_until_ready((state, out))
        found = sorted(glob.glob(os.path.join(a.trace_dir, "**", "perfetto_trace.json.gz"),
                                 recursive=True), key=os.path.getmtime)
        trace = found[-1] if found else None
    n = cfg.parallel.data * cfg.parallel.pipe * cfg.parallel.tensor
    mem = [d.memory_stats() or {} for d in jax.devices()[:n]]
    out = {"config": a.config, "overrides": a.overrides, "device": jax.devices()[0].device_kind,
           "mesh": list(mesh_shape), "schedule": cfg.parallel.schedule,
           "v": cfg.parallel.virtual_stages, "m": cfg.num_microbatches,
           "micro_batch": cfg.train.micro_batch_size, "recompute": cfg.train.recompute,
           "step_time_s": round(statistics.median(times), 4),
           "step_times_s": [round(t, 4) for t in times], "first_step_s": round(first, 2),
           "step_time_queued_s": round(queued, 4), "combine_mib": a.combine_mib or None,
           "permute_mode": a.permute_mode,
           "tokens_per_s": round(B * s / statistics.median(times), 1),
           "peak_mem_gib": [round(m.get("peak_bytes_in_use", 0) / 2**30, 2) for m in mem],
           "final_loss": round(final_loss, 4), "trace": trace, "trace_steps": a.trace_steps}
    print(json.dumps(out), flush=True)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
