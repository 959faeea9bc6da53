"""Where a traced train step's GPU time goes: kernels by category, per device and per pipeline tick.

Reads the perfetto trace of one step that jax.profiler writes (``perfetto_trace.json.gz``, see
``benchmarks/capture_step.py``; ``benchmarks/profile_step.py`` is the command line). Standard
library only (no jax), pure functions. Times are microseconds (``_us``, the trace's unit) unless
a name says ``_ms`` or ``_s``.

* Every kernel gets one category from ``CATEGORY_RULES`` (first matching rule wins).
* Kernels of one device overlap on several streams. Each instant of the step window counts once,
  for the highest-priority category running then (``PRIORITY``): a NCCL kernel that only waits
  while a GEMM runs on another stream costs nothing. ``idle`` = window - busy.
* Pipeline ticks: the executor's ``ppermute``s run as NCCL SendRecv kernels once per tick. Those
  with less than ``merge_busy_us`` of other work between them and no permute (hlo_op) repeated
  form one boundary; the time between two boundaries is one tick, including the wait inside
  the closing boundary. XLA may move the permutes to the top of the loop body (a boundary then
  *starts* its tick): the alignment is chosen so that ticks the schedule labels idle ('.') hold
  the least GEMM/attention time, unless ``tick_offset`` fixes it. The tick touching the window's
  edge also holds the step's prologue or epilogue and is left out of the per-tick means
  (reported as ``edge_ms``).
"""
from __future__ import annotations

import bisect
import functools
import gzip
import json
import re
from collections import Counter, defaultdict
from typing import NamedTuple, Sequence


class Kernel(NamedTuple):
    """One device activity of the trace."""
    name: str
    ts_us: float
    dur_us: float
    stream: int        # the trace's tid
    hlo_op: str
    module: str        # hlo_module ('' if none)
    threads: int       # grid x block threads; 0 if the trace does not say

    @property
    def end_us(self) -> float:
        return self.ts_us + self.dur_us


# (category, regex searched in the kernel name, max_threads or None); first match wins, else
# 'other'. A rule with max_threads matches only kernels of at most that many threads in all.
# gemm: cuBLAS (nvjet_*, *gemm*) and Triton (gemm_fusion_dot_*); attention: cuDNN (sdpa, flash
# and its cudnn::fusion helpers); control: host round trips, cond/while predicates, and kernels
# of one warp or less (counters, branch indices); copy: D2D memcpy and data movement; fill:
# memsets and broadcast fusions; elementwise: the other XLA fusions (loop_, input_, Triton).
CATEGORY_RULES: tuple[tuple[str, str, int | None], ...] = (
    ("collective", r"^nccl", None),
    ("gemm", r"gemm|^nvjet_|cutlass|cublas|xmma|matmul", None),
    ("attention", r"sdpa|flash|fmha|cudnn", None),
    ("control", r"^Memcpy(D2H|H2D|H2H)|^set_\w*condition", None),
    ("fill", r"^[Mm]emset|broadcast_fusion|^wrapped_broadcast", None),
    ("control", r"", 32),
    ("copy", r"^[Mm]emcpy|copy|transpose|slice|concatenate|pad_fusion|^wrapped_pad", None),
    ("elementwise", r"^(loop|input|fusion|wrapped|triton)|reduce|scatter|select", None),
)
# Overlap priority, highest first; also the column order of the report.
PRIORITY: tuple[str, ...] = ("gemm", "attention", "elementwise", "copy", "fill", "other",
                             "control", "collective")
COLUMNS: tuple[str, ...] = PRIORITY + ("idle",)
BOUNDARY_PATTERN = r"SendRecv|collective-permute|ppermute"   # collective kernels that end a tick
COMPUTE = ("gemm", "attention")                               # what an idle tick should not hold
_RULES = tuple((c, re.compile(p), n) for c, p, n in CATEGORY_RULES)
_DEVICE = re.compile(r"/device:[A-Z]+:(\d+)$")


# ----------------------------------------------------------------------------------- reading

def _threads(details: str) -> int:
    """grid x block thread count from 'grid:48,1,1 block:128,1,1 ...'; 0 if absent."""
    dims = {k: int(x) * int(y) * int(z)
            for k, x, y, z in re.findall(r"(grid|block):(\d+),(\d+),(\d+)", details or "")}
    return dims.get("grid", 0) * dims.get("block", 0)


def read_trace(path: str) -> dict:
    """The trace's JSON (.json or .json.gz, told apart by the gzip magic bytes)."""
    with open(path, "rb") as f:
        raw = f.read()
    return json.loads(gzip.decompress(raw) if raw.startswith(b"\x1f\x8b") else raw)


def device_kernels(trace: dict) -> dict[int, list[Kernel]]:
    """Every complete ('X') event of each '/device:GPU:i' process, by start, keyed by i."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    device_of = {}
    for e in events:
        if e.get("ph") == "M" and e.get("name") == "process_name":
            m = _DEVICE.search(str(e.get("args", {}).get("name", "")))
            if m:
                device_of[e["pid"]] = int(m.group(1))
    out: dict[int, list[Kernel]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("pid") in device_of:
            a = e.get("args", {})
            out[device_of[e["pid"]]].append(Kernel(
                e.get("name", ""), float(e["ts"]), float(e.get("dur", 0.0)), e.get("tid", 0),
                a.get("hlo_op", ""), a.get("hlo_module", ""),
                _threads(a.get("kernel_details", ""))))
    return {d: sorted(ks, key=lambda k: k.ts_us) for d, ks in sorted(out.items())}


def busiest_module(devices: dict[int, list[Kernel]]) -> str:
    """The hlo_module with the most device time (the train step, e.g. 'jit_step_fn')."""
    total: Counter = Counter()
    for k in (k for ks in devices.values() for k in ks if k.module):
        total[k.module] += k.dur_us
    return total.most_common(1)[0][0] if total else ""


def step_kernels(trace: dict, module: str | None = None) -> dict[int, list[Kernel]]:
    """Per-device kernels of `module` (default: the busiest module), sorted by start."""
    devices = device_kernels(trace)
    module = busiest_module(devices) if module is None else module
    return {d: [k for k in ks if k.module == module] for d, ks in devices.items()}


def load_trace(path: str, module: str | None = None) -> dict[int, list[Kernel]]:
    """step_kernels of the trace file at `path` (.json or .json.gz)."""
    return step_kernels(read_trace(path), module)


# ------------------------------------------------------------------------------- categories

def classify(k: Kernel) -> str:
    """The kernel's category: the first rule of CATEGORY_RULES that matches, else 'other'."""
    return _category(k.name, k.threads)


@functools.lru_cache(maxsize=4096)
def _category(name: str, threads: int) -> str:
    for cat, rx, max_threads in _RULES:
        if (max_threads is None or 0 < threads <= max_threads) and rx.search(name):
            return cat
    return "other"


MIN_RUN_GAP_US = 20_000      # capture_step.py pauses 100 ms between traced steps
BACK_TO_BACK_GAP_US = 1_000  # --back-to-back: only the host's loss read and next dispatch
                             # (2-3.5 ms at (4,1,1), 4x H200, 2026-11-27) separate two steps


def last_run(devices: dict[int, list[Kernel]], runs: int,
             min_gap_us: float = MIN_RUN_GAP_US) -> dict[int, list[Kernel]]:
    """The kernels of the last of `runs` executions traced one after the other, each waited
    for before the next and a pause between them (benchmarks/capture_step.py --trace-steps):
    cut at the latest interval of at least min_gap_us in which no device runs a kernel
    (runs - 1 of them needed). Steps traced back to back (capture_step.py --back-to-back)
    have no pause: cut them at BACK_TO_BACK_GAP_US, which a step with all devices idle that
    long inside it (a pipeline of tiny kernels) would cut wrongly. The first traced step can
    be skewed by the profiler's start (4x H200, 2026-11-26: a 410 ms window for a 200 ms
    step), the next one is not."""
    if runs <= 1:
        return devices
    spans = sorted((k.ts_us, k.end_us) for ks in devices.values() for k in ks)
    gaps, end = [], spans[0][1]
    for a, b in spans[1:]:
        if a > end:
            gaps.append((a - end, a))
        end = max(end, b)
    if len(gaps) < runs - 1:
        raise ValueError(f"expected {runs} traced runs, found {len(gaps) + 1} (no gap between "
                         f"them in which every device is idle)")
    pauses = [start for length, start in gaps if length >= min_gap_us]
    if len(pauses) < runs - 1:
        longest = max(length for length, _ in gaps) / 1e3
        raise ValueError(f"expected {runs} traced runs, but only {len(pauses)} interval(s) in "
                         f"which every device is idle last {min_gap_us / 1e3:g} ms or more "
                         f"(the longest: {longest:.2f} ms): the runs overlap (wait for each "
                         f"run's whole output and pause before the next; steps traced back to "
                         f"back: profile_step.py --back-to-back)")
    # the latest such pause: a long idle interval the profiler's start causes inside the first
    # run comes before it
    cut = max(pauses)
    return {d: [k for k in ks if k.ts_us >= cut] for d, ks in devices.items()}


def step_window_us(devices: dict[int, list[Kernel]]) -> tuple[float, float]:
    """(first kernel start, last kernel end) over ALL devices: one window for every stage."""
    return (min(ks[0].ts_us for ks in devices.values() if ks),
            max(k.end_us for ks in devices.values() for k in ks))


def exclusive_timeline(kernels: Sequence[Kernel], start_us: float, end_us: float
                       ) -> list[tuple[float, float, str]]:
    """Sorted, non-overlapping (t0_us, t1_us, category) pieces of [start_us, end_us]: each instant
    goes to the highest-PRIORITY category running then; instants with no kernel are left out."""
    rank = {c: i for i, c in enumerate(PRIORITY)}
    edges = []
    for k in kernels:
        a, b = max(k.ts_us, start_us), min(k.end_us, end_us)
        if b > a:
            r = rank[classify(k)]
            edges += [(a, 1, r), (b, -1, r)]
    edges.sort()
    running = [0] * len(PRIORITY)
    pieces: list[tuple[float, float, str]] = []
    prev = None
    for t, step, r in edges:
        top = next((i for i, n in enumerate(running) if n > 0), None)
        if top is not None and t > prev:
            cat = PRIORITY[top]
            if pieces and pieces[-1][2] == cat and pieces[-1][1] == prev:
                pieces[-1] = (pieces[-1][0], t, cat)
            else:
                pieces.append((prev, t, cat))
        running[r] += step
        prev = t
    return pieces


def category_time_us(pieces: list[tuple[float, float, str]], start_us: float, end_us: float
                     ) -> dict[str, float]:
    """Time per category (COLUMNS, 'idle' included) of the pieces clipped to [start_us, end_us]."""
    out = dict.fromkeys(COLUMNS, 0.0)
    i = bisect.bisect_right(pieces, start_us, key=lambda p: p[1])
    while i < len(pieces) and pieces[i][0] < end_us:
        a, b, cat = pieces[i]
        out[cat] += max(0.0, min(b, end_us) - max(a, start_us))
        i += 1
    out["idle"] = max(0.0, (end_us - start_us) - sum(out[c] for c in PRIORITY))
    return out


# ------------------------------------------------------------------------------------ ticks

def tick_boundaries_us(kernels: Sequence[Kernel], pieces: list[tuple[float, float, str]],
                       pattern: str = BOUNDARY_PATTERN, merge_busy_us: float = 100.0
                       ) -> list[tuple[float, float]]:
    """(start_us, end_us) of each tick boundary: collective kernels whose name or hlo_op matches
    `pattern`. A kernel joins the current boundary when the device did less than `merge_busy_us`
    of other work since that boundary's last kernel (`pieces`: its exclusive_timeline) and its
    hlo_op is not in the boundary yet (each permute runs once per tick: a repeat starts the next
    tick, even after an idle tick with no work). Busy time, not wall time: host launch latency
    can leave 100-400 us idle between the permutes of one boundary."""
    rx = re.compile(pattern)
    marks = sorted((k.ts_us, k.end_us, k.hlo_op) for k in kernels
                   if classify(k) == "collective" and (rx.search(k.name) or rx.search(k.hlo_op)))
    out: list[tuple[float, float]] = []
    ops: set[str] = set()
    for a, b, op in marks:
        if out and (not op or op not in ops) and _work_us(pieces, out[-1][1], a) < merge_busy_us:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
            ops = set()
        ops.add(op)
    return out


def _work_us(pieces, start_us: float, end_us: float) -> float:
    """Busy time of non-collective categories in [start_us, end_us] (0 if empty)."""
    t = category_time_us(pieces, start_us, max(start_us, end_us))
    return sum(v for c, v in t.items() if c not in ("idle", "collective"))


def tick_spans_us(bounds: list[tuple[float, float]], window_us: tuple[float, float], offset: int
                  ) -> list[tuple[float, float, bool]]:
    """(start_us, end_us, at_edge) of tick i = 0..len(bounds)-1. offset 0: boundary i ends tick i
    (tick 0 starts at the window start); offset 1: boundary i starts tick i (the last tick runs to
    the window end). at_edge marks that tick, which also holds the prologue or epilogue."""
    ends = [b for _, b in bounds]
    if offset == 0:
        starts = [window_us[0]] + ends[:-1]
        return [(a, b, i == 0) for i, (a, b) in enumerate(zip(starts, ends))]
    stops = ends[1:] + [window_us[1]]
    return [(a, b, i == len(ends) - 1) for i, (a, b) in enumerate(zip(ends, stops))]


def tick_table(pieces, spans, labels: Sequence[str]) -> list[dict]:
    """One dict per tick: label, start/duration (us), at_edge, time per category (us)."""
    return [{"label": lab, "start_us": a, "dur_us": b - a, "at_edge": edge,
             "us": category_time_us(pieces, a, b)} for (a, b, edge), lab in zip(spans, labels)]


def idle_label_compute_us(ticks: list[dict]) -> float:
    """GEMM + attention time inside ticks labelled idle ('.'): ~0 when ticks are aligned right."""
    return sum(t["us"][c] for t in ticks if t["label"] == "." and not t["at_edge"] for c in COMPUTE)


def mean_by_label_ms(ticks: list[dict]) -> dict[str, dict]:
    """Per label, and for 'all' ticks and the 'busy' ones (not labelled idle '.'): number of
    ticks (the edge tick left out), mean tick ms and mean ms per category."""
    groups: dict[str, list[dict]] = defaultdict(list)
    for t in ticks:
        if not t["at_edge"]:
            groups["all"].append(t)
            groups["busy"].extend([t] if t["label"] != "." else [])
            groups[t["label"]].append(t)
    return {lab: {"ticks": len(g), "tick_ms": sum(t["dur_us"] for t in g) / len(g) / 1e3,
                  "ms": {c: sum(t["us"][c] for t in g) / len(g) / 1e3 for c in COLUMNS}}
            for lab, g in groups.items() if g}


# ----------------------------------------------------------------------------------- report

def idle_after_us(kernels: Sequence[Kernel], pieces: list[tuple[float, float, str]],
                  prefix: str = "MemcpyD2H") -> list[float]:
    """For each kernel named `prefix`...: the idle time from its end to the next busy piece (the
    host's turn-around after a device-to-host copy: it reads the value, then launches more)."""
    out = []
    for k in kernels:
        if k.name.startswith(prefix):
            i = bisect.bisect_left(pieces, k.end_us, key=lambda p: p[0])
            out.append(pieces[i][0] - k.end_us if i < len(pieces) else 0.0)
    return out


def top_kernels(devices: dict[int, list[Kernel]], n: int = 5) -> dict[str, list[dict]]:
    """Per category, the n kernel names with the most total time over all devices (wall time of
    the kernel, overlaps not removed): count, total ms, mean us."""
    total, count, cat_of = Counter(), Counter(), {}
    for ks in devices.values():
        for k in ks:
            total[k.name] += k.dur_us
            count[k.name] += 1
            cat_of.setdefault(k.name, classify(k))
    out: dict[str, list[dict]] = defaultdict(list)
    for name, us in total.most_common():
        if len(out[cat_of[name]]) < n:
            out[cat_of[name]].append({"name": name, "count": count[name],
                                      "total_ms": us / 1e3, "mean_us": us / count[name]})
    return {c: out[c] for c in PRIORITY if out.get(c)}


def report(devices: dict[int, list[Kernel]], labels: Sequence[Sequence[str]] | None = None,
           stage_of_device: dict[int, int] | None = None, ideal_s: float | None = None,
           step_s: float | None = None, top_n: int = 5, merge_busy_us: float = 100.0,
           tick_offset: int | None = None) -> dict:
    """The JSON-able analysis. labels[tick][stage]: op label ('F', 'b', 'B', '.') per tick;
    stage_of_device: default device i = stage i; step_s: the measured step time (default: the
    window); ideal_s: the ideal step time. tick_offset: 0 or 1 (see tick_spans_us), None = auto."""
    devices = {d: ks for d, ks in devices.items() if ks}
    if not devices:
        raise ValueError("no device kernels in the trace's step module")
    stage_of = stage_of_device or {d: d for d in devices}
    staged = [d for d in devices if d in stage_of]     # devices of the mesh: tick analysis
    window = step_window_us(devices)
    window_us = window[1] - window[0]
    pieces = {d: exclusive_timeline(ks, *window) for d, ks in devices.items()}
    out = {"module": next(iter(devices.values()))[0].module, "window_ms": window_us / 1e3,
           "step_s": step_s, "ideal_s": ideal_s, "categories": list(COLUMNS), "devices": {}}
    step = step_s if step_s is not None else window_us / 1e6
    out["step_over_ideal"] = step / ideal_s if ideal_s else None
    bounds = {d: tick_boundaries_us(ks, pieces[d], merge_busy_us=merge_busy_us)
              for d, ks in devices.items()}
    n_ticks = len(labels) if labels is not None else None
    matched = n_ticks is not None and bool(staged) and all(len(bounds[d]) == n_ticks
                                                            for d in staged)
    ticks = {}
    if matched:
        lab = {d: [row[stage_of[d]] for row in labels] for d in staged}
        cand = {o: {d: tick_table(pieces[d], tick_spans_us(bounds[d], window, o), lab[d])
                    for d in staged} for o in (0, 1)}
        wrong = {o: sum(idle_label_compute_us(t) for t in cand[o].values()) for o in (0, 1)}
        offset = tick_offset if tick_offset is not None else min((0, 1), key=lambda o: wrong[o])
        ticks = cand[offset]
        out["ticks"] = {"expected": n_ticks, "matched": True, "offset": offset,
                        "idle_label_compute_ms": {str(o): w / 1e3 for o, w in wrong.items()}}
    else:
        out["ticks"] = {"expected": n_ticks, "matched": False,
                        "found": {str(d): len(b) for d, b in bounds.items()}}
    for d, ks in devices.items():
        whole = category_time_us(pieces[d], *window)
        row = {"stage": stage_of.get(d), "boundaries": len(bounds[d]),
               "ms": {c: v / 1e3 for c, v in whole.items()},
               "pct": {c: 100 * v / window_us for c, v in whole.items()},
               "d2h_copies": sum(k.name.startswith("MemcpyD2H") for k in ks),
               "idle_after_d2h_ms": sum(idle_after_us(ks, pieces[d])) / 1e3}
        if d in ticks:
            row["by_op"] = mean_by_label_ms(ticks[d])
            row["edge_ms"] = sum(t["dur_us"] for t in ticks[d] if t["at_edge"]) / 1e3
        out["devices"][str(d)] = row
    out["top_kernels"] = top_kernels(devices, top_n)
    out["unclassified"] = sorted({k.name for ks in devices.values() for k in ks
                                  if classify(k) == "other"})
    return out
