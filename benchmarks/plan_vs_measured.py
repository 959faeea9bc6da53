"""How far `ptdp-plan`'s model is from the measured steps: for every case of one or more JSON
lines files (bench_train.py or capture_step.py lines, a "tag" each when a runner adds one), the
planner's predicted step and peak memory against the measured ones, in a Markdown table.

    PYTHONPATH=. python benchmarks/plan_vs_measured.py benchmarks/records/*.jsonl

The GPU kind is read from each case's device name (H100 or H200); the layout from its config,
mesh and overrides, and the recompute, micro batch, schedule and v it ran with where recorded. Cases that are not train steps are left out; a case run under XLA flags
(its tag says so; record.jsonl does not) is predicted as without them.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys


def gpu_of(device: str) -> str:
    """'NVIDIA H200' -> 'h200'; the planner's kinds are named by the chip."""
    name = device.lower()
    for kind in ("h200", "h100", "a100"):
        if kind in name:
            return kind
    raise ValueError(f"no planner GPU kind for device {device!r}")


def predict(case: dict, gpus_per_host: int = 8) -> tuple[float, float]:
    """(predicted step s, predicted peak GiB per device) of one record.jsonl case."""
    from ptdp_jax.config.load import load_config, parse_cli_overrides
    from ptdp_jax.training.memory import GiB
    from ptdp_jax.plan.estimate import estimate_step
    from ptdp_jax.plan.hardware import gpu_kind
    ran = {"train.recompute": case.get("recompute"), "train.micro_batch_size": case.get("micro_batch"),
           "parallel.schedule": case.get("schedule"), "parallel.virtual_stages": case.get("v"),
           "train.dtype": case.get("dtype")}               # the layout as it ran, where recorded
    cfg = load_config(case["config"], {**parse_cli_overrides(case["overrides"]),
                                       **{k: v for k, v in ran.items() if v is not None}})
    d, p, t = case["mesh"]
    cfg = dataclasses.replace(cfg, parallel=dataclasses.replace(cfg.parallel, data=d, pipe=p,
                                                                tensor=t))
    est = estimate_step(cfg, gpu_kind(gpu_of(case["device"])), gpus_per_host)
    return est.step_time_s, est.memory.total / GiB


def rows(paths: list[str]) -> list[str]:
    out = ["| file | case | device | measured s | predicted s | pred/meas | measured GiB | "
           "predicted GiB | pred/meas |", "|---|---|---|---|---|---|---|---|---|"]
    for path in paths:
        for line in open(path):
            case = json.loads(line)
            if "step_time_s" not in case or "mesh" not in case:
                continue
            if "overrides" not in case:   # older bench_train.py lines (2026-11-27)
                out.append(f"| {path} | {case.get('tag', '')} | {case.get('device', '')} | "
                           f"{case['step_time_s']} | no overrides in this record: not "
                           f"predicted | | | | |")
                continue
            # a direct capture_step.py line has no tag: its mesh and overrides name it
            tag = case.get("tag") or " ".join([",".join(map(str, case["mesh"]))] + case["overrides"])
            try:
                step, gib = predict(case)
            except Exception as e:   # a layout the planner refuses: say why, go on
                out.append(f"| {path} | {tag} | {case['device']} | {case['step_time_s']} "
                           f"| {type(e).__name__}: {e} | | | | |")
                continue
            meas_gib = max(case.get("peak_mem_gib") or [0.0]) or float("nan")   # no stats: nan
            out.append(f"| {path.split('/')[-1]} | {tag} | {case['device']} | "
                       f"{case['step_time_s']:.4f} | {step:.4f} | {step / case['step_time_s']:.2f} | "
                       f"{meas_gib:.2f} | {gib:.2f} | {gib / meas_gib:.2f} |")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", help="JSON lines files")
    a = ap.parse_args(argv)
    print("\n".join(rows(a.records)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
