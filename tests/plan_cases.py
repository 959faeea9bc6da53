"""Shared by tests/test_plan.py, test_plan_measured.py and test_plan_records.py: the GPU
kinds, configs as the measured rows ran them, and the fastest row of a plan."""
from pathlib import Path

from ptdp_jax.config.load import load_config
from ptdp_jax.plan.hardware import gpu_kind, with_overrides

ROOT = Path(__file__).resolve().parents[1]
A100 = gpu_kind("a100")
H100 = gpu_kind("h100")
# the h200 kind with the H100's element-wise bandwidth (3.35e12 B/s), its calibration before
# 2026-11-28: the H200 rows of 2026-11-26/27 (tests/test_plan_measured.py) ran slower code than
# the current one and stay checked against it; later H200 steps against the kind itself
# (tests/test_plan_records.py)
H200_BEFORE_S36 = with_overrides(gpu_kind("h200"), {"memory_bound_bytes_per_s": 3.35e12})


# configs/bench-1.3b.yaml states only its model and batch; the rows measured with it ran these
BENCH_RAN = {"train.micro_batch_size": 4, "train.dtype": "bfloat16", "train.recompute": "selective"}


def bench(**overrides):
    """configs/bench-1.3b.yaml as its measured rows ran it (BENCH_RAN), with overrides."""
    return load_config(str(ROOT / "configs" / "bench-1.3b.yaml"), {**BENCH_RAN, **overrides})


def config(name, **overrides):
    """A config as the measured rows of tests/test_plan_measured.py ran it: the MLP activation
    recomputed (tuning.keep_ffn_activation=false, as before 2026-11-27), the default here;
    bench-1.3b with BENCH_RAN."""
    path = None if name is None else str(ROOT / "configs" / f"{name}.yaml")
    keys = {"tuning.keep_ffn_activation": False, **(BENCH_RAN if name == "bench-1.3b" else {})}
    return load_config(path, {**keys, **{k.replace("__", "."): v for k, v in overrides.items()}})


def best(rows, **keys):
    """The fastest valid-or-soft-rejected (estimated, fitting) row matching keys."""
    out = [r for r in rows if r.estimate is not None and r.fits
           and all(getattr(r, k) == v for k, v in keys.items())]
    return min(out, key=lambda r: r.estimate.step_time_s)
