"""When a step's NCCL kernels run, and how much of each has compute beside it.

    PYTHONPATH=. python benchmarks/nccl_timeline.py TRACE [--device 0] [--step 1]

TRACE: perfetto_trace.json[.gz] of `benchmarks/capture_step.py --trace-dir ... --trace-steps 3
--back-to-back` (steps queued as the timed loop runs them). Steps are cut at the GPU's idle
gaps over 1 ms; --step picks one (the second by default: the first may wait for the host).
Prints each NCCL kernel's start within the step, its length and the part of it with a compute
kernel running beside it: a collective with nothing beside it is on the step's critical path
(session 24: zero 2's reduce-scatters combined into two after the backward)."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ptdp_jax import profiling  # noqa: E402


def step_starts_us(kernels, gap_us: float = profiling.BACK_TO_BACK_GAP_US) -> list[float]:
    """The start of each run of kernels that follows an idle gap of at least gap_us."""
    starts, busy = [kernels[0].ts_us], kernels[0].end_us
    for k in kernels[1:]:
        if k.ts_us - busy > gap_us:
            starts.append(k.ts_us)
        busy = max(busy, k.end_us)
    return starts


def beside_us(compute, lo: float, hi: float) -> float:
    """Time in [lo, hi) with a compute kernel running (their union)."""
    return sum(b - a for a, b, _ in profiling.exclusive_timeline(compute, lo, hi))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--step", type=int, default=1)
    a = ap.parse_args(argv)
    kernels = sorted(profiling.load_trace(a.trace)[a.device], key=lambda k: k.ts_us)
    starts = step_starts_us(kernels) + [kernels[-1].end_us + 1]
    step = min(a.step, len(starts) - 2)
    lo, hi = starts[step], starts[step + 1]
    inside = [k for k in kernels if lo <= k.ts_us < hi]
    compute = [k for k in inside if profiling.classify(k) != "collective"]
    print(f"GPU {a.device}, step {step} of {len(starts) - 1}: "
          f"{(max(k.end_us for k in inside) - lo) / 1e3:.1f} ms")
    print("| start ms | ms | ms with compute beside | kernel |\n|---|---|---|---|")
    for k in inside:
        if profiling.classify(k) == "collective":
            print(f"| {(k.ts_us - lo) / 1e3:.1f} | {(k.end_us - k.ts_us) / 1e3:.2f} | "
                  f"{beside_us(compute, k.ts_us, k.end_us) / 1e3:.2f} | {k.name[:50]} |")


if __name__ == "__main__":
    main(sys.argv[1:])
