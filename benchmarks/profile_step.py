"""Where a pipeline step's GPU time goes: trace one step and break it down by kernel category,
per stage and per pipeline tick (F / b / B / idle), against the ideal step time.

    PYTHONPATH=. python benchmarks/profile_step.py configs/bench-1.3b.yaml --mesh 1,4,1 \
        [--one-gpu-step 0.623] [--trace FILE [--step-time S]] [--steps 6] [--trace-dir DIR] \
        [--json OUT] [--top 5] [key=value ...]

Without `--trace`, runs benchmarks/capture_step.py (GPUs: times `--steps` steps, traces one) and
analyses its trace; with `--trace FILE` (perfetto_trace.json[.gz]) it only analyses (CPU is
enough). The expected tick count and each (tick, stage)'s op come from the config's pipeline
schedule. `--trace-steps N`: the trace holds N steps (capture_step.py --trace-steps); the last is read.
`--one-gpu-step S`: the one-GPU step time of the same global batch; the ideal step is
S / (d p t) x (1 + bubble), bubble = (p-1)/m (gpipe, 1f1b) or (p-1)/(v m) (interleaved). Prints
markdown tables (profiling_format.format_report, in this folder); `--json OUT` writes the
full report."""
from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profiling  # noqa: E402  (benchmarks/: standard library only, no jax)
import profiling_format  # noqa: E402


def load_cfg(config: str, mesh: tuple[int, int, int], overrides: list[str]):
    """The config with the mesh applied (no jax needed)."""
    from ptdp_jax.config.load import load_config, parse_cli_overrides
    cfg = load_config(config, parse_cli_overrides(overrides))
    d, p, t = mesh
    return dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, data=d, pipe=p,
                                                                 tensor=t))


def schedule_of(cfg):
    """The executor's schedule for cfg; built here if the executor's schedule_for is unusable."""
    try:
        from ptdp_jax.pipeline.executor import schedule_for
        return schedule_for(cfg)
    except Exception as e:   # the executor is being rewritten: any failure falls back
        print(f"note: executor.schedule_for unusable ({type(e).__name__}: {e}); "
              "building the schedule here", file=sys.stderr)
    from ptdp_jax.pipeline.schedule import build_schedule
    p, v = cfg.parallel.pipe, cfg.parallel.virtual_stages
    layers_per_chunk = cfg.model.num_layers // (p * v)
    return build_schedule(cfg.parallel.schedule, p, cfg.num_microbatches, v,
                          split_backward=layers_per_chunk >= 2)


def op_label(op) -> str:
    """'F' forward, 'b' upper-half backward, 'B' lower-half or whole backward, '.' idle."""
    if op is None:
        return "."
    return "b" if op.half == "upper" else op.kind


def tick_labels(sched, schedule: str = "") -> list[list[str]]:
    """labels[tick][stage] of a Schedule, one tick a table row. The phased tables (1f1b-phased,
    zb-phased) send one permute a row (a forward row down, a backward row up), so each row is
    one boundary too."""
    return [[op_label(op) for op in row] for row in sched.table]


def merge_busy_us(schedule: str) -> float:
    """How much work may separate two permutes of one tick boundary (profiling.report): none
    for the phased tables, whose every row holds exactly one permute (an idle stage's rows run
    back to back, and XLA's unrolled copies of the warm-up and cool-down loops give each
    row's permute an HLO name of its own); 100 us for the others, whose tick sends both ways."""
    from ptdp_jax.pipeline.schedule import PHASED
    return 0.0 if schedule in PHASED else 100.0


def stage_of_device(mesh: tuple[int, int, int]) -> dict[int, int]:
    """Device index -> pipeline stage for a (data, pipe, tensor) mesh laid out in device order
    (tensor fastest, as ptdp_jax.parallel.sharding.make_mesh does)."""
    d, p, t = mesh
    return {i: (i // t) % p for i in range(d * p * t)}


def bubble(p: int, m: int, v: int = 1, schedule: str = "1f1b") -> float:
    """(p-1)/m, or (p-1)/(v m) for the interleaved tables, interleaved and the phased ones at
    v > 1 (the ideal for v chunks; 0 if p = 1)."""
    return (p - 1) / (v * m if schedule in ("interleaved", "1f1b-phased", "zb-phased") else m)


def ideal_step_s(one_gpu_step_s: float, mesh: tuple[int, int, int], m: int, v: int = 1,
                 schedule: str = "1f1b") -> float:
    """S / (d p t) x (1 + bubble)."""
    d, p, t = mesh
    return one_gpu_step_s / (d * p * t) * (1 + bubble(p, m, v, schedule))


def lockstep_floor(rep: dict, mesh: tuple[int, int, int], m: int, v: int = 1,
                   schedule: str = "1f1b", one_gpu_step_s: float | None = None,
                   step_s: float | None = None) -> str:
    """Markdown: each stage's kernel time (every category but collectives and idle) and the
    floor of a lockstep step with those kernels, busiest stage x (1 + bubble). Kernel durations
    survive the profiler where waits do not (4x H100, 2026-11-27: a 208 ms pipeline step traced
    as 453 ms), so step / ideal splits into kernels / (one-GPU step / devices) x step / floor."""
    stage_ms: dict[int, float] = {}
    for row in rep["devices"].values():
        ms = sum(x for c, x in row["ms"].items() if c not in ("collective", "idle"))
        stage_ms[row["stage"]] = max(stage_ms.get(row["stage"], 0.0), ms)
    floor_ms = max(stage_ms.values()) * (1 + bubble(mesh[1], m, v, schedule))
    n = mesh[0] * mesh[1] * mesh[2]
    share = one_gpu_step_s * 1e3 / n if one_gpu_step_s else None
    rows = [[s, ms] + ([ms / share] if share else []) for s, ms in sorted(stage_ms.items())]
    out = ["### Lockstep floor: the busiest stage's kernels x (1 + bubble)",
           profiling_format.table(["stage", "kernel ms"]
                                  + (["/ one-GPU share"] if share else []), rows),
           "", f"floor {floor_ms:.1f} ms"]
    if share:
        out[-1] += f"; one-GPU share {share:.1f} ms (one-GPU step / {n})"
    if step_s:
        out[-1] += (f"; measured step {step_s * 1e3:.1f} ms = {step_s * 1e3 / floor_ms:.2f}x the "
                    "floor (waits and per-tick fixed costs)")
    return "\n".join(out) + "\n"


def trace_fidelity(devices, window_ms: float, step_s: float | None) -> str:
    """Markdown: how far the traced step is from the timed one. The profiler slows a pipelined
    step with or without XLA's command buffers (4x H100, 2026-11-27: a 193 ms zb-phased step
    traced as a 669-724 ms window), so gaps and waits are the profiler's; kernel durations
    hold, except for compute kernels that ran beside an NCCL kernel (1.2-1.9x slower there)."""
    out = ["### Trace against the timed step"]
    if step_s:
        ratio = window_ms / (step_s * 1e3)
        out.append(f"window {window_ms:.1f} ms = {ratio:.2f}x the timed step"
                   + ("; gaps, waits and idle in this trace are the profiler's, not the step's"
                      if ratio > 1.3 else ""))
    rows = []
    for d, ks in devices.items():
        coll = sorted((k.ts_us, k.end_us) for k in ks if profiling.classify(k) == "collective")
        beside = total = 0.0
        for k in ks:
            if profiling.classify(k) == "collective":
                continue
            total += k.dur_us
            if any(a < k.end_us and b > k.ts_us for a, b in coll):
                beside += k.dur_us
        rows.append([d, total / 1e3, beside / 1e3])
    out.append(profiling_format.table(
        ["device", "compute kernel ms", "of it beside an NCCL kernel"], rows))
    return "\n".join(out) + "\n"


def collectives_by_op(devices) -> str:
    """Collective kernel time per HLO op and device (markdown): which all-reduce or permute
    waits where. In lockstep a collective's kernel also holds the wait for the slowest peer, so
    the device that arrives first shows the longer time."""
    per, name, calls = {}, {}, {}
    for d, ks in devices.items():
        for k in ks:
            if profiling.classify(k) == "collective":
                per[(k.hlo_op, d)] = per.get((k.hlo_op, d), 0.0) + k.dur_us / 1e3
                calls[(k.hlo_op, d)] = calls.get((k.hlo_op, d), 0) + 1
                name.setdefault(k.hlo_op, k.name.split("(")[0].replace("ncclDevKernel_", ""))
    devs = sorted(devices)
    ops = sorted(name, key=lambda o: -sum(per.get((o, d), 0.0) for d in devs))
    rows = [[o, name[o], max(calls.get((o, d), 0) for d in devs)]
            + [per.get((o, d), 0.0) for d in devs] for o in ops]
    return ("### Collectives by HLO op: ms per device (a kernel's time includes its wait)\n"
            + profiling_format.table(["hlo op", "kernel", "calls"]
                                     + [f"GPU{d} ms" for d in devs], rows)
            + "\n")


def capture(config: str, mesh: str, steps: int, trace_dir: str, overrides: list[str],
            trace_steps: int = 1, back_to_back: bool = False) -> dict:
    """Run benchmarks/capture_step.py's main() (GPUs): its JSON line as a dict."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "capture_step.py")
    spec = importlib.util.spec_from_file_location("capture_step", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main([config, "--mesh", mesh, "--steps", str(steps), "--trace-dir", trace_dir,
                     "--trace-steps", str(trace_steps)] + ["--back-to-back"] * back_to_back
                    + list(overrides))


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--mesh", required=True, help="d,p,t")
    ap.add_argument("--one-gpu-step", type=float, default=None, help="one-GPU step time, s")
    ap.add_argument("--trace", default="", help="analyse this trace only (no GPU run)")
    ap.add_argument("--step-time", type=float, default=None,
                    help="measured step time, s, for --trace (default: the trace's window)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps of the capture run")
    ap.add_argument("--trace-dir", default="", help="where the capture run writes (default: temp)")
    ap.add_argument("--trace-steps", type=int, default=1,
                    help="steps in the trace (capture_step.py --trace-steps): the last is read")
    ap.add_argument("--back-to-back", action="store_true",
                    help="the traced steps ran back to back (capture_step.py --back-to-back): "
                         "cut them at all-device idle gaps of 1 ms, not at a pause")
    ap.add_argument("--json", default="", help="write the report dict here")
    ap.add_argument("--top", type=int, default=5, help="kernels listed per category")
    ap.add_argument("overrides", nargs="*")
    a = ap.parse_intermixed_args(argv)

    mesh = tuple(int(x) for x in a.mesh.split(","))
    cfg = load_cfg(a.config, mesh, a.overrides)
    sched = schedule_of(cfg)
    step_s, trace = a.step_time, a.trace
    if not trace:
        run = capture(a.config, a.mesh, a.steps, a.trace_dir or tempfile.mkdtemp(prefix="trace_"),
                      a.overrides, a.trace_steps, a.back_to_back)
        step_s, trace = run["step_time_s"], run["trace"]
        if not trace:
            sys.exit("capture_step.py wrote no trace")
    ideal = None
    if a.one_gpu_step:
        ideal = ideal_step_s(a.one_gpu_step, mesh, sched.m, sched.v, cfg.parallel.schedule)
    gap = profiling.BACK_TO_BACK_GAP_US if a.back_to_back else profiling.MIN_RUN_GAP_US
    devices = profiling.last_run(profiling.load_trace(trace), a.trace_steps, gap)
    rep = profiling.report(devices, tick_labels(sched, cfg.parallel.schedule),
                           stage_of_device(mesh), ideal_s=ideal, step_s=step_s, top_n=a.top,
                           merge_busy_us=merge_busy_us(cfg.parallel.schedule))
    rep.update({"config": a.config, "overrides": a.overrides, "mesh": list(mesh), "trace": trace,
                "schedule": cfg.parallel.schedule, "m": sched.m, "v": sched.v})
    print(f"{a.config} mesh {a.mesh} {cfg.parallel.schedule} m={sched.m} v={sched.v} "
          f"ticks={sched.num_ticks} trace {trace}\n")
    print(collectives_by_op(devices), flush=True)
    print(trace_fidelity(devices, rep["window_ms"], step_s), flush=True)
    print(profiling_format.format_report(rep), flush=True)
    if mesh[1] > 1:
        print("\n" + lockstep_floor(rep, mesh, sched.m, sched.v, cfg.parallel.schedule,
                                    a.one_gpu_step, step_s), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rep, f, indent=1)
    return rep


if __name__ == "__main__":
    main(sys.argv[1:])
