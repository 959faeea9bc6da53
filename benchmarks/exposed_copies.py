"""Copy-category time with no GEMM, attention or element-wise kernel beside it, by kernel name:
what a trace's "copy" column is made of (peer copies waited for, slice and concatenate fusions).

    python benchmarks/exposed_copies.py TRACE.json.gz [--steps 2] [--top 12]

Per device, ms per step (the trace's whole span divided by --steps, the steps it holds).
"""
from __future__ import annotations

import argparse
import bisect
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from ptdp_jax import profiling as P  # noqa: E402

ABOVE = ("gemm", "attention", "elementwise")     # categories that hide a copy beside them


def _merged(spans):
    out = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def exposed_by_name(kernels) -> dict[str, float]:
    """{copy kernel name: us of it with no ABOVE kernel running}."""
    hide = _merged((k.ts_us, k.end_us) for k in kernels if P.classify(k) in ABOVE)
    starts = [a for a, _ in hide]

    def covered(a, b):
        t, i = 0.0, max(0, bisect.bisect_right(starts, a) - 1)
        while i < len(hide) and hide[i][0] < b:
            x, y = hide[i]
            t += max(0.0, min(b, y) - max(a, x))
            i += 1
        return t
    out: dict[str, float] = defaultdict(float)
    for k in kernels:
        if P.classify(k) == "copy":
            out[k.name] += k.dur_us - covered(k.ts_us, k.end_us)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--steps", type=float, default=2)
    ap.add_argument("--top", type=int, default=12)
    a = ap.parse_args(argv)
    for d, ks in sorted(P.load_trace(a.trace).items()):
        rows = sorted(exposed_by_name(ks).items(), key=lambda x: -x[1])
        print(f"GPU{d}: copy time with nothing above it, ms a step "
              f"(total {sum(t for _, t in rows) / 1e3 / a.steps:.2f})")
        for name, t in rows[:a.top]:
            print(f"  {t / 1e3 / a.steps:8.2f}  {name[:70]}")


if __name__ == "__main__":
    main()
