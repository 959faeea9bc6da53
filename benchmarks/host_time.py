"""Where the host's time goes in a traced step, next to the GPUs' idle time.

    python benchmarks/host_time.py TRACE [--ticks N] [--top 15]

TRACE: a perfetto_trace.json[.gz] from `benchmarks/capture_step.py --trace-dir` (one step).
Prints the host events (every process that is not a '/device:GPU:i') summed by name, the
largest first, with their count and milliseconds (per tick with `--ticks`), and per GPU the
step's window, its busy time (the union of its kernels) and its idle time. A step whose GPUs
idle while a host event per tick takes longer than a GPU tick is host-bound."""
from __future__ import annotations

import argparse
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ptdp_jax.profiling import read_trace, step_kernels  # noqa: E402


def host_events(trace: dict) -> dict[str, tuple[int, float]]:
    """{event name: (count, total us)} over the complete ('X') events of the processes that
    are not GPUs."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    gpu = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
           and "/device:GPU" in str(e.get("args", {}).get("name", ""))}
    out: dict[str, list] = defaultdict(lambda: [0, 0.0])
    for e in events:
        if e.get("ph") == "X" and e.get("pid") not in gpu:
            out[e.get("name", "")][0] += 1
            out[e.get("name", "")][1] += float(e.get("dur", 0.0))
    return {k: (n, us) for k, (n, us) in out.items()}


def gpu_busy(trace: dict) -> dict[int, tuple[float, float]]:
    """{GPU: (window us, busy us)}: first to last kernel of the step's module, and the
    union of its kernels' intervals."""
    out = {}
    for d, ks in step_kernels(trace).items():
        if not ks:
            continue
        busy, end = 0.0, ks[0].ts_us
        start = ks[0].ts_us
        for k in ks:                       # sorted by start
            lo, hi = max(k.ts_us, end), k.ts_us + k.dur_us
            if hi > lo:
                busy += hi - lo
            end = max(end, hi)
        out[d] = (end - start, busy)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--ticks", type=int, default=0, help="ticks per step (per-tick column)")
    ap.add_argument("--top", type=int, default=15)
    a = ap.parse_args(argv)
    trace = read_trace(a.trace)
    per = f" | per tick ms (/{a.ticks})" if a.ticks else ""
    print(f"| host event | count | ms{per} |\n|---|---|---{'|---' if a.ticks else ''}|")
    rows = sorted(host_events(trace).items(), key=lambda kv: -kv[1][1])[: a.top]
    for name, (n, us) in rows:
        tick = f" | {us / 1e3 / a.ticks:.3f}" if a.ticks else ""
        print(f"| {name[:70]} | {n} | {us / 1e3:.2f}{tick} |")
    print("\n| GPU | step window ms | busy ms | idle ms |\n|---|---|---|---|")
    for d, (win, busy) in gpu_busy(trace).items():
        print(f"| {d} | {win / 1e3:.2f} | {busy / 1e3:.2f} | {(win - busy) / 1e3:.2f} |")


if __name__ == "__main__":
    main()
