"""Where a step's GPU idle time sits: every gap between kernels of the train step (no kernel
running on the device), grouped by the kernel that ends before it and the one that starts
after it, largest total first.

    PYTHONPATH=. python benchmarks/idle_gaps.py TRACE [--device 0] [--top 15] [--min-us 20]

TRACE: perfetto_trace.json[.gz] of benchmarks/capture_step.py --trace-dir. The kernel names say
what the GPU waited for: after a MemcpyD2H the host read a value (a predicate) before launching
more; before a command buffer's first kernel, the host's launch; around NCCL kernels, a peer."""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ptdp_jax import profiling  # noqa: E402


def gaps(kernels, min_us: float = 20.0) -> list[tuple[float, str, str]]:
    """(gap us, kernel before, kernel after) for each stretch with no kernel running."""
    out, busy_until, last = [], None, ""
    for k in kernels:
        if busy_until is not None and k.ts_us - busy_until >= min_us:
            out.append((k.ts_us - busy_until, last, k.name))
        if busy_until is None or k.end_us > busy_until:
            busy_until, last = k.end_us, k.name
    return out


def grouped(gs, width: int = 48) -> list[tuple[float, int, str, str]]:
    """(total us, count, before, after) per (before, after) pair, largest total first."""
    acc = defaultdict(lambda: [0.0, 0])
    for g, a, b in gs:
        key = (a[:width], b[:width])
        acc[key][0] += g
        acc[key][1] += 1
    return sorted(((t, n, a, b) for (a, b), (t, n) in acc.items()), reverse=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--device", type=int, default=None, help="one device (default: each)")
    ap.add_argument("--top", type=int, default=15)
    ap.add_argument("--min-us", type=float, default=20.0, help="shorter gaps are left out")
    a = ap.parse_args(argv)
    devices = profiling.load_trace(a.trace)
    for d, ks in devices.items():
        if a.device is not None and d != a.device:
            continue
        gs = gaps(ks, a.min_us)
        window = (ks[-1].end_us - ks[0].ts_us) / 1e3 if ks else 0.0
        print(f"\n### GPU {d}: {len(gs)} gaps >= {a.min_us:g} us, {sum(g for g, _, _ in gs) / 1e3:.1f}"
              f" ms idle of a {window:.1f} ms window")
        print("| total ms | count | mean us | kernel before | kernel after |\n|---|---|---|---|---|")
        for t, n, before, after in grouped(gs)[:a.top]:
            print(f"| {t / 1e3:.2f} | {n} | {t / n:.0f} | {before} | {after} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
