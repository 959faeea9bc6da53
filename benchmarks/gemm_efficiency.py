"""GEMM efficiency against size, from a traced step and its optimized HLO: where the planner's
H100/H200 curve (`ptdp_jax/plan/hardware.py` H100_GEMM) comes from.

    PYTHONPATH=. python benchmarks/gemm_efficiency.py TRACE.json.gz HLO.txt.gz [--peak-tflops 989]

Triton GEMM fusions (`gemm_fusion_dot*`) carry their HLO name in the kernel name, so their
(M, K, N) come from the fusion's dot in the HLO; cuBLAS kernels (`nvjet_*`, `*gemm*`) do not
say which custom call they run, so they are listed by kernel name with their times only (their
FLOPs are one of the layer's GEMM sizes: match them by count and time). Prints one line per
kernel: count, median microseconds, and for the fusions GFLOP and the fraction of the peak.
Standard library only.
"""
from __future__ import annotations

import argparse
import gzip
import os
import re
import statistics
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profiling import classify, load_trace  # noqa: E402  (benchmarks/profiling.py)

_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) \((.*)\) -> (.*) \{$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+) ")


def _dims(shape: str) -> list[int]:
    m = re.search(r"\[([0-9,]*)\]", shape)
    return [int(x) for x in m.group(1).split(",") if x] if m else []


def fusion_gemms(hlo_text: str) -> dict[str, tuple[int, int, int]]:
    """{fusion name: (M, K, N)} of every gemm_fusion computation's dot (M x N output rows and
    columns flattened: M N = output elements, K = the contracted size)."""
    out, cur, shapes = {}, None, {}
    for line in hlo_text.splitlines():
        h = _HEADER.match(line)
        if h:
            cur = h.group(1)
            shapes = {n: s for n, s in re.findall(r"(\S+): (\S+?\])", h.group(2))}
            continue
        m = _INSTR.match(line)
        if not m or cur is None:
            continue
        shapes[m.group(1)] = m.group(2)
        if " dot(" in line and cur.startswith("gemm_fusion_dot"):
            lhs = re.search(r"dot\(%(\S+?),", line).group(1)
            contract = [int(x) for x in re.search(r"lhs_contracting_dims=\{([0-9,]*)\}",
                                                  line).group(1).split(",")]
            K = 1
            for d in contract:
                K *= _dims(shapes[lhs])[d]
            n_out = 1
            for d in _dims(m.group(2)):
                n_out *= d
            cols = _dims(m.group(2))[-1]
            out[cur.removesuffix("_computation")] = (n_out // cols, K, cols)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("hlo")
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args(argv)
    with gzip.open(a.hlo, "rt") if a.hlo.endswith(".gz") else open(a.hlo) as f:
        gemms = fusion_gemms(f.read())
    times = defaultdict(list)
    for kernels in load_trace(a.trace).values():
        for k in kernels:
            if classify(k) == "gemm":
                times[k.name].append(k.dur_us)
    print(f"{'kernel':52s} {'count':>5s} {'median us':>9s}  M x K x N, GFLOP, fraction of peak")
    for name, ts in sorted(times.items(), key=lambda kv: -sum(kv[1])):
        med = statistics.median(ts)
        hlo = re.sub(r"_(\d+)$", r".\1", name)
        extra = ""
        if hlo in gemms:
            M, K, N = gemms[hlo]
            flops = 2.0 * M * K * N
            extra = (f"  {M} x {K} x {N}, {flops / 1e9:.1f}, "
                     f"{flops / (med * 1e-6) / (a.peak_tflops * 1e12):.3f}")
        print(f"{name[:52]:52s} {len(ts):5d} {med:9.1f}{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
