"""Shared by tests/test_plan.py, test_plan_measured.py and test_plan_records.py: the GPU
kinds, configs as the measured rows ran them, and the fastest row of a plan."""
from pathlib import Path

from ptdp_jax.config import load_config
from ptdp_jax.plan.hardware import gpu_kind, with_overrides

ROOT = Path(__file__).resolve().parents[1]
A100 = gpu_kind("a100")
H100 = gpu_kind("h100")
# the h200 kind as calibrated before session 36 (element-wise kernels at the H100's 3.35e12 B/s):
# the H200 rows of sessions 14-21 (tests/test_plan_measured.py) ran the code of their time,
# slower than today's (the 7.5B pipeline ~2.6% on H100 between sessions 20 and 29), and stay
# checked against it; today's H200 steps against the kind itself (test_plan_records.py,
# test_h200_s33_s36_measurements)
H200_BEFORE_S36 = with_overrides(gpu_kind("h200"), {"memory_bound_bytes_per_s": 3.35e12})


def config(name, **overrides):
    """A config as the measured rows of tests/test_plan_measured.py ran it: before session 22,
    with the MLP activation recomputed (train.keep_ffn_activation=false), the default here."""
    path = None if name is None else str(ROOT / "configs" / f"{name}.yaml")
    keys = {"train.keep_ffn_activation": False}
    return load_config(path, {**keys, **{k.replace("__", "."): v for k, v in overrides.items()}})


def best(rows, **keys):
    """The fastest valid-or-soft-rejected (estimated, fitting) row matching keys."""
    out = [r for r in rows if r.estimate is not None and r.fits
           and all(getattr(r, k) == v for k, v in keys.items())]
    return min(out, key=lambda r: r.estimate.step_time_s)
