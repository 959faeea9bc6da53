"""Synthetic perfetto traces for the tests of benchmarks/profiling.py and the benchmark tools
that read traces (tests/test_profiling.py, tests/test_bench_tools.py): no GPU, no jax."""
from __future__ import annotations

import importlib.util
import os

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def load(rel_path: str, name: str):
    """A module loaded from its file (benchmarks/ is not a package; ptdp_jax would import jax)."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel_path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


P = load("benchmarks/profiling.py", "profiling")
F = load("benchmarks/profiling_format.py", "profiling_format")

MODULE = "jit_step_fn"
BIG = "grid:1024,1,1 block:128,1,1"


def k(name, ts, dur, tid=1, hlo_op="op", module=MODULE, details=BIG):
    """One kernel spec for make_trace."""
    return dict(name=name, ts=ts, dur=dur, tid=tid, hlo_op=hlo_op, module=module, details=details)


def make_trace(devices: dict[int, list[dict]], host_events: int = 1) -> dict:
    """A jax.profiler-like trace: a process per '/device:GPU:i' (pid i+1) and a host process."""
    ev = [{"ph": "M", "pid": 701, "name": "process_name", "args": {"name": "/host:CPU"}}]
    ev += [{"ph": "X", "pid": 701, "tid": 5, "ts": 0.0, "dur": 1e6, "name": "host"}] * host_events
    for d, ks in devices.items():
        ev.append({"ph": "M", "pid": d + 1, "name": "process_name",
                   "args": {"name": f"/device:GPU:{d}"}})
        for s in ks:
            ev.append({"ph": "X", "pid": d + 1, "tid": s["tid"], "ts": s["ts"], "dur": s["dur"],
                       "name": s["name"], "args": {"hlo_op": s["hlo_op"], "hlo_module": s["module"],
                                                   "kernel_details": s["details"]}})
    ev.append({})
    return {"displayTimeUnit": "ns", "traceEvents": ev}


def kernels(devices: dict[int, list[dict]]) -> dict[int, list[P.Kernel]]:
    """The step's kernels of a synthetic trace."""
    return P.step_kernels(make_trace(devices))
