"""Views of a traced step (perfetto_trace.json[.gz] of `benchmarks/capture_step.py --trace-dir`)
beside profile_step.py's category table. Standard library only.

    python benchmarks/trace_tools.py idle TRACE [--device 0] [--top 15] [--min-us 20]
    python benchmarks/trace_tools.py host TRACE [--ticks N] [--top 15]
    python benchmarks/trace_tools.py nccl TRACE [--device 0] [--step 1]
    python benchmarks/trace_tools.py copies TRACE [--steps 2] [--top 12]
    python benchmarks/trace_tools.py diff BASE_TRACE OTHER_TRACE [--trace-steps 2] [--top 25]
        [--device 0] [--names BASE,OTHER]

idle: every gap with no kernel running, grouped by the kernels before and after it (after a
MemcpyD2H the host read a value before launching more; before a command buffer's first kernel,
the host's launch; around NCCL kernels, a peer). host: the host events summed by name, and per
GPU its window, busy and idle time (a step whose GPUs idle while a host event per tick takes
longer than a GPU tick is host-bound). nccl: each NCCL kernel's start in one step and the part
of it with compute beside it (a collective with nothing beside it is on the critical path;
trace with `--trace-steps 3 --back-to-back`, steps cut at idle gaps over 1 ms). copies: the
copy-category time with no GEMM, attention or element-wise kernel beside it, by kernel name.
diff: kernel time by family in two traced steps side by side (e.g. micro 1 against micro 8 on
the same global batch, the same FLOPs): a family is the category and, for GEMM and attention,
the kernel name, for any other kernel its HLO op without the numeric suffix."""
from __future__ import annotations

import argparse
import bisect
import os
import re
import sys
from collections import Counter, defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import profiling  # noqa: E402  (benchmarks/profiling.py)

# ------------------------------------------------------------------------------ idle

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


def idle_main(a) -> None:
    for d, ks in profiling.load_trace(a.trace).items():
        if a.device is not None and d != a.device:
            continue
        gs = gaps(ks, a.min_us)
        window = (ks[-1].end_us - ks[0].ts_us) / 1e3 if ks else 0.0
        print(f"\n### GPU {d}: {len(gs)} gaps >= {a.min_us:g} us, "
              f"{sum(g for g, _, _ in gs) / 1e3:.1f} ms idle of a {window:.1f} ms window")
        print("| total ms | count | mean us | kernel before | kernel after |\n"
              "|---|---|---|---|---|")
        for t, n, before, after in grouped(gs)[:a.top]:
            print(f"| {t / 1e3:.2f} | {n} | {t / n:.0f} | {before} | {after} |")

# ------------------------------------------------------------------------------ host

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
    for d, ks in profiling.step_kernels(trace).items():
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


def host_main(a) -> None:
    trace = profiling.read_trace(a.trace)
    per = f" | per tick ms (/{a.ticks})" if a.ticks else ""
    print(f"| host event | count | ms{per} |\n|---|---|---{'|---' if a.ticks else ''}|")
    for name, (n, us) in sorted(host_events(trace).items(), key=lambda kv: -kv[1][1])[:a.top]:
        tick = f" | {us / 1e3 / a.ticks:.3f}" if a.ticks else ""
        print(f"| {name[:70]} | {n} | {us / 1e3:.2f}{tick} |")
    print("\n| GPU | step window ms | busy ms | idle ms |\n|---|---|---|---|")
    for d, (win, busy) in gpu_busy(trace).items():
        print(f"| {d} | {win / 1e3:.2f} | {busy / 1e3:.2f} | {(win - busy) / 1e3:.2f} |")

# ------------------------------------------------------------------------------ nccl

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


def nccl_main(a) -> None:
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

# ------------------------------------------------------------------------------ copies

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
    hide = _merged((k.ts_us, k.end_us) for k in kernels if profiling.classify(k) in ABOVE)
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
        if profiling.classify(k) == "copy":
            out[k.name] += k.dur_us - covered(k.ts_us, k.end_us)
    return out


def copies_main(a) -> None:
    for d, ks in sorted(profiling.load_trace(a.trace).items()):
        rows = sorted(exposed_by_name(ks).items(), key=lambda x: -x[1])
        print(f"GPU{d}: copy time with nothing above it, ms a step "
              f"(total {sum(t for _, t in rows) / 1e3 / a.steps:.2f})")
        for name, t in rows[:a.top]:
            print(f"  {t / 1e3 / a.steps:8.2f}  {name[:70]}")

# ------------------------------------------------------------------------------ diff

_SUFFIX = re.compile(r"[._]\d+$")


def family(k: profiling.Kernel) -> tuple[str, str]:
    """(category, family key) of a kernel."""
    cat = profiling.classify(k)
    if cat in ("gemm", "attention") or not k.hlo_op:
        return cat, k.name[:80]
    # inside a command buffer (CUDA graph) the HLO op is the buffer's: the kernel is the fusion
    op = k.name if k.hlo_op.startswith("command_buffer") else k.hlo_op
    while _SUFFIX.search(op):
        op = _SUFFIX.sub("", op)
    return cat, op


def step_families(path: str, trace_steps: int, device: int) -> tuple[dict, dict, float]:
    """({family: (count, summed ms)}, {category: exclusive ms incl. idle}, window ms) of the last
    traced step on `device`."""
    devices = profiling.load_trace(path)
    devices = profiling.last_run(devices, trace_steps) if trace_steps > 1 else devices
    return step_families_of(devices[device])


def step_families_of(ks: list[profiling.Kernel]) -> tuple[dict, dict, float]:
    """step_families of one device's kernels."""
    count, total = Counter(), Counter()
    for k in ks:
        f = family(k)
        count[f] += 1
        total[f] += k.dur_us / 1e3
    start, end = ks[0].ts_us, max(k.end_us for k in ks)
    pieces = profiling.exclusive_timeline(ks, start, end)
    cats = {c: us / 1e3 for c, us in profiling.category_time_us(pieces, start, end).items()}
    return {f: (count[f], total[f]) for f in count}, cats, (end - start) / 1e3


def compare(base: dict, other: dict, top: int) -> list[tuple]:
    """Rows (category, family, n_base, ms_base, n_other, ms_other, diff) of the `top` families
    with the largest |difference|, largest first."""
    rows = []
    for f in set(base) | set(other):
        nb, tb = base.get(f, (0, 0.0))
        no, to = other.get(f, (0, 0.0))
        rows.append((f[0], f[1], nb, tb, no, to, to - tb))
    rows.sort(key=lambda r: -abs(r[6]))
    return rows[:top]


def diff_main(a) -> None:
    nb, no = a.names.split(",")
    fb, cb, wb = step_families(a.base, a.trace_steps, a.device)
    fo, co, wo = step_families(a.other, a.trace_steps, a.device)
    print(f"window: {nb} {wb:.1f} ms, {no} {wo:.1f} ms ({wo - wb:+.1f})\n")
    print(f"| category (exclusive ms) | {nb} | {no} | diff |\n|---|---|---|---|")
    for c in profiling.COLUMNS:
        print(f"| {c} | {cb[c]:.1f} | {co[c]:.1f} | {co[c] - cb[c]:+.1f} |")
    by_cat_b, by_cat_o = Counter(), Counter()
    for f, (_, t) in fb.items():
        by_cat_b[f[0]] += t
    for f, (_, t) in fo.items():
        by_cat_o[f[0]] += t
    print(f"\n| category (summed kernel ms) | {nb} | {no} | diff |\n|---|---|---|---|")
    for c in profiling.PRIORITY:
        print(f"| {c} | {by_cat_b[c]:.1f} | {by_cat_o[c]:.1f} | {by_cat_o[c] - by_cat_b[c]:+.1f} |")
    print(f"\n| category | family | n {nb} | ms {nb} | n {no} | ms {no} | diff ms |\n"
          "|---|---|---|---|---|---|---|")
    for c, f, n1, t1, n2, t2, d in compare(fb, fo, a.top):
        print(f"| {c} | `{f}` | {n1} | {t1:.2f} | {n2} | {t2:.2f} | {d:+.2f} |")

# ------------------------------------------------------------------------------ CLI

def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="view", required=True)
    p = sub.add_parser("idle", help="idle gaps by the kernels around them")
    p.add_argument("trace")
    p.add_argument("--device", type=int, default=None, help="one device (default: each)")
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--min-us", type=float, default=20.0, help="shorter gaps are left out")
    p.set_defaults(run=idle_main)
    p = sub.add_parser("host", help="host events and the GPUs' idle time")
    p.add_argument("trace")
    p.add_argument("--ticks", type=int, default=0, help="ticks per step (per-tick column)")
    p.add_argument("--top", type=int, default=15)
    p.set_defaults(run=host_main)
    p = sub.add_parser("nccl", help="NCCL kernels of one step and the compute beside them")
    p.add_argument("trace")
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--step", type=int, default=1, help="default the second: the first may "
                                                       "wait for the host")
    p.set_defaults(run=nccl_main)
    p = sub.add_parser("copies", help="copy time with nothing above it, by kernel name")
    p.add_argument("trace")
    p.add_argument("--steps", type=float, default=2, help="steps the trace holds")
    p.add_argument("--top", type=int, default=12)
    p.set_defaults(run=copies_main)
    p = sub.add_parser("diff", help="kernel time by family in two traced steps")
    p.add_argument("base")
    p.add_argument("other")
    p.add_argument("--trace-steps", type=int, default=2)
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--names", default="base,other")
    p.set_defaults(run=diff_main)
    a = ap.parse_args(argv)
    a.run(a)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
