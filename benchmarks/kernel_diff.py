"""Where one traced step spends more kernel time than another: kernels grouped by family, per
step, side by side (e.g. one GPU at micro 1 against micro 8 on the same global batch, so both
steps do the same FLOPs and any difference is what the smaller kernels cost).

    python benchmarks/kernel_diff.py BASE_TRACE OTHER_TRACE [--trace-steps 2] [--top 25]
        [--device 0] [--names BASE,OTHER]

Each trace is a perfetto_trace.json.gz of benchmarks/capture_step.py (`--trace-steps N`: the
last of N traced steps is read, as profile_step.py does). A family is the category
(ptdp_jax.profiling.CATEGORY_RULES) and, for GEMM and attention kernels, the kernel name (it
names the tile shape), for every other kernel its HLO op with the numeric suffix dropped
(`loop_multiply_fusion.516` -> `loop_multiply_fusion`); a kernel run inside a command buffer
carries the buffer's name as its HLO op, so its kernel name is used instead. Prints per
category and per family: kernel count and summed kernel time (ms) in each step, and the
difference. Summed kernel time counts overlapping kernels twice; the category table also gives
the exclusive time (profiling.exclusive_timeline) and idle. Standard library only.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from ptdp_jax import profiling  # noqa: E402  (standard library only: no jax)

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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("other")
    ap.add_argument("--trace-steps", type=int, default=2)
    ap.add_argument("--device", type=int, default=0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--names", default="base,other")
    a = ap.parse_args(argv)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
