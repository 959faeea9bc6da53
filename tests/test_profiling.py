"""Tests of the step-trace analysis (ptdp_jax.profiling) on synthetic perfetto traces: no GPU,
no jax."""
from __future__ import annotations

import gzip
import importlib.util
import json
import os
from types import SimpleNamespace
from typing import NamedTuple

import pytest

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _load(rel_path: str, name: str):
    """A module loaded from its file: importing the ptdp_jax package would import jax."""
    spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, rel_path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


P = _load("ptdp_jax/profiling.py", "profiling")
F = _load("ptdp_jax/profiling_format.py", "profiling_format")

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


# ------------------------------------------------------------------------------ categories

@pytest.mark.parametrize("name, details, cat", [
    ("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", BIG, "gemm"),
    ("gemm_fusion_dot_54", BIG, "gemm"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7", BIG, "attention"),
    ("void cudnn::fusion::convert_dq_to_16bits<true>(void const*)", BIG, "attention"),
    ("ncclDevKernel_SendRecv(ncclDevKernelArgsStorage<4096ul>)", BIG, "collective"),
    ("memcpy128", BIG, "copy"), ("memcpy32_post", "grid:1,1,1 block:256,1,1", "copy"),
    ("MemcpyD2D", "", "copy"), ("wrapped_transpose", BIG, "copy"),
    ("loop_dynamic_update_slice_fusion_66", BIG, "copy"),
    ("loop_dynamic_slice_fusion_9", BIG, "copy"),
    ("input_concatenate_fusion_2", BIG, "copy"), ("loop_slice_fusion_5", BIG, "copy"),
    ("Memset 0", "", "fill"), ("loop_broadcast_fusion_70", BIG, "fill"),
    ("MemcpyD2H", "", "control"), ("MemcpyH2D", "", "control"),
    ("set_case_condition", "grid:1,1,1 block:1,1,1", "control"),
    ("loop_add_fusion_12", "grid:1,1,1 block:1,1,1", "control"),            # tiny: a counter
    ("loop_and_clamp_compare_dynamic_slice_or_select_fusion", "grid:1,1,1 block:1,1,1", "control"),
    ("loop_add_fusion_12", BIG, "elementwise"), ("loop_select_fusion_13", BIG, "elementwise"),
    ("input_reduce_fusion_3", BIG, "elementwise"), ("fusion_918", BIG, "elementwise"),
    ("some_custom_kernel", BIG, "other"),
])
def test_classify(name, details, cat):
    [kern] = kernels({0: [k(name, 0.0, 1.0, details=details)]})[0]
    assert P.classify(kern) == cat


def test_rules_and_priority_name_known_categories():
    assert {c for c, _, _ in P.CATEGORY_RULES} <= set(P.PRIORITY)
    assert P.PRIORITY[0] == "gemm" and P.PRIORITY[-1] == "collective"
    assert P.COLUMNS[-1] == "idle"


# ------------------------------------------------------------------------------ loading

@pytest.mark.parametrize("suffix", [".json", ".json.gz"])
def test_load_trace_keeps_devices_and_the_busiest_module(tmp_path, suffix):
    trace = make_trace({1: [k("gemm_b", 50.0, 10.0), k("gemm_a", 10.0, 30.0),
                            k("tiny", 0.0, 5.0, module="jit_other"), k("x", 1.0, 1.0, module="")],
                        0: [k("gemm_c", 0.0, 20.0, details="grid:2,3,1 block:4,1,1")]})
    path = tmp_path / ("t" + suffix)
    data = json.dumps(trace).encode()
    path.write_bytes(gzip.compress(data) if suffix.endswith(".gz") else data)
    devs = P.load_trace(str(path))
    assert sorted(devs) == [0, 1]                                  # host process left out
    assert [x.name for x in devs[1]] == ["gemm_a", "gemm_b"]      # sorted, other modules dropped
    assert devs[0][0].threads == 24 and devs[0][0].module == MODULE
    assert [x.name for x in P.load_trace(str(path), module="jit_other")[1]] == ["tiny"]


# ------------------------------------------------------------------------------ overlap rule

def test_each_instant_counts_once_for_the_highest_priority_category():
    devs = kernels({0: [k("nvjet_gemm", 0.0, 100.0, tid=1),
                        k("ncclDevKernel_SendRecv", 0.0, 150.0, tid=2),     # waits under the GEMM
                        k("memcpy128", 120.0, 80.0, tid=1),
                        k("loop_add_fusion_1", 130.0, 10.0, tid=3)],
                    1: [k("Memset 0", 290.0, 10.0)]})                       # widens the window
    window = P.step_window_us(devs)
    assert window == (0.0, 300.0)
    t = P.category_time_us(P.exclusive_timeline(devs[0], *window), *window)
    assert t["gemm"] == 100.0
    assert t["collective"] == 20.0                      # only 100..120, where nothing else runs
    assert t["elementwise"] == 10.0 and t["copy"] == 70.0
    assert t["idle"] == 100.0                           # 200..300: the other device's tail
    assert sum(t.values()) == pytest.approx(300.0)
    part = P.category_time_us(P.exclusive_timeline(devs[0], *window), 90.0, 135.0)
    assert part == pytest.approx({**dict.fromkeys(P.COLUMNS, 0.0), "gemm": 10.0,
                                  "collective": 20.0, "copy": 10.0, "elementwise": 5.0})


def test_report_idle_is_window_minus_busy():
    devs = kernels({0: [k("nvjet_gemm", 0.0, 100.0), k("memcpy128", 50.0, 100.0, tid=2)],
                    1: [k("nvjet_gemm", 100.0, 300.0)]})
    r = P.report(devs)
    assert r["window_ms"] == pytest.approx(0.4)
    d0 = r["devices"]["0"]["ms"]
    assert d0["gemm"] == pytest.approx(0.1) and d0["copy"] == pytest.approx(0.05)
    assert d0["idle"] == pytest.approx(0.4 - 0.15)
    assert r["devices"]["1"]["ms"]["idle"] == pytest.approx(0.1)
    assert r["ticks"]["matched"] is False and "No schedule" in F.format_report(r)


# ------------------------------------------------------------------------------ ticks

LABELS = [["F", "."], ["F", "F"], ["B", "F"], ["B", "B"], [".", "B"]]   # labels[tick][stage]
OP_GEMM_US = {"F": 300.0, "B": 500.0, ".": 0.0}
TICK_US, PROLOGUE_US = 1000.0, 200.0


def pipeline_devices(boundary_first: bool, labels=LABELS, n_bounds=None, d2h=True):
    """Stage s on GPU s; each tick: the op's GEMM (plus a fill), and a boundary of two SendRecv
    kernels 250 us apart with nothing between (host latency), before or after the op."""
    out = {}
    for s in range(len(labels[0])):
        ks = [k("loop_broadcast_fusion_1", 0.0, PROLOGUE_US)]
        for i, row in enumerate(labels[: n_bounds or len(labels)]):
            t0 = PROLOGUE_US + i * TICK_US
            op_t0, b_t0 = (t0 + 400.0, t0) if boundary_first else (t0, t0 + 600.0)
            if d2h:
                ks.append(k("MemcpyD2H", op_t0, 5.0, hlo_op="conditional.19", details=""))
            if OP_GEMM_US[row[s]]:
                ks.append(k("nvjet_gemm", op_t0 + 10.0, OP_GEMM_US[row[s]]))
            ks.append(k("Memset 0", op_t0 + 10.0, 20.0, tid=2))               # under the GEMM
            ks += [k("ncclDevKernel_SendRecv", b_t0, 50.0, hlo_op="ppermute.10.2"),
                   k("ncclDevKernel_SendRecv", b_t0 + 300.0, 50.0, tid=3, hlo_op="ppermute.11.1")]
        end = PROLOGUE_US + len(labels) * TICK_US
        ks.append(k("ncclDevKernel_AllReduce_Sum_f32", end, 100.0, hlo_op="all-reduce.1"))
        out[s] = ks
    return kernels(out)


@pytest.mark.parametrize("boundary_first", [False, True])
def test_ticks_are_found_aligned_and_attributed(boundary_first):
    devs = pipeline_devices(boundary_first)
    r = P.report(devs, LABELS)
    t = r["ticks"]
    assert t["matched"] and t["expected"] == 5
    assert t["offset"] == (1 if boundary_first else 0)
    assert t["idle_label_compute_ms"][str(t["offset"])] == 0.0
    assert t["idle_label_compute_ms"][str(1 - t["offset"])] > 0.0
    for s, dev in r["devices"].items():
        by_op = dev["by_op"]
        # the edge tick (first if boundaries end ticks, last if they start them) is left out
        kept = [row[int(s)] for row in (LABELS[:-1] if boundary_first else LABELS[1:])]
        for op in "FB.":
            if op in kept:
                assert by_op[op]["ticks"] == kept.count(op)
                assert by_op[op]["ms"]["gemm"] == pytest.approx(OP_GEMM_US[op] / 1e3)
                assert by_op[op]["ms"]["fill"] == pytest.approx(0.0 if op != "." else 0.02)
                assert by_op[op]["ms"]["collective"] == pytest.approx(0.1)
                assert by_op[op]["ms"]["control"] == pytest.approx(0.005)
            else:
                assert op not in by_op
        assert by_op["all"]["ticks"] == 4 and by_op["all"]["tick_ms"] == pytest.approx(1.0)
        assert by_op["busy"]["ticks"] == sum(x != "." for x in kept)
        for st in by_op.values():
            assert sum(st["ms"].values()) == pytest.approx(st["tick_ms"])
        assert dev["d2h_copies"] == 5
    assert "Ticks: 5 per device" in F.format_report(r)


def test_tick_offset_can_be_forced():
    r = P.report(pipeline_devices(False), LABELS, tick_offset=1)
    assert r["ticks"]["offset"] == 1
    # misaligned: stage 1's first interior tick is labelled idle but holds an F's GEMM
    assert r["devices"]["1"]["by_op"]["."]["ms"]["gemm"] > 0


def test_boundaries_merge_across_idle_gaps_but_not_across_work():
    idle_gap = kernels({0: [k("ncclDevKernel_SendRecv", 0.0, 50.0, hlo_op="ppermute.1"),
                            k("ncclDevKernel_SendRecv", 300.0, 50.0, tid=2, hlo_op="ppermute.2"),
                            k("MemcpyD2H", 100.0, 5.0, details="")]})[0]
    pieces = P.exclusive_timeline(idle_gap, 0.0, 350.0)
    assert P.tick_boundaries_us(idle_gap, pieces) == [(0.0, 350.0)]
    work_gap = idle_gap + kernels({0: [k("memcpy128", 60.0, 200.0)]})[0]
    pieces = P.exclusive_timeline(work_gap, 0.0, 350.0)
    assert P.tick_boundaries_us(work_gap, pieces) == [(0.0, 50.0), (300.0, 350.0)]
    # the same permutes again with no work between: an idle tick, so a new boundary
    back_to_back = kernels({0: [k("ncclDevKernel_SendRecv", 0.0, 50.0, hlo_op="ppermute.1"),
                                k("ncclDevKernel_SendRecv", 60.0, 50.0, hlo_op="ppermute.2"),
                                k("ncclDevKernel_SendRecv", 120.0, 50.0, hlo_op="ppermute.1"),
                                k("ncclDevKernel_SendRecv", 180.0, 50.0, hlo_op="ppermute.2")]})[0]
    pieces = P.exclusive_timeline(back_to_back, 0.0, 230.0)
    assert P.tick_boundaries_us(back_to_back, pieces) == [(0.0, 110.0), (120.0, 230.0)]
    # phased tables (one permute a row): no merging, each permute its own boundary
    assert len(P.tick_boundaries_us(back_to_back, pieces, merge_busy_us=0.0)) == 4
    assert len(P.tick_boundaries_us(idle_gap, P.exclusive_timeline(idle_gap, 0.0, 350.0),
                                    merge_busy_us=0.0)) == 2
    # collectives that are not permutes (the gradient all-reduce) are no boundary
    ar = kernels({0: [k("ncclDevKernel_AllReduce_Sum_f32", 0.0, 50.0, hlo_op="all-reduce.3")]})[0]
    assert P.tick_boundaries_us(ar, P.exclusive_timeline(ar, 0.0, 50.0)) == []


def test_tick_count_mismatch_falls_back_to_whole_step_figures():
    devs = pipeline_devices(False, n_bounds=4)
    r = P.report(devs, LABELS)
    assert r["ticks"] == {"expected": 5, "matched": False, "found": {"0": 4, "1": 4}}
    assert all("by_op" not in v for v in r["devices"].values())
    assert r["devices"]["0"]["ms"]["gemm"] == pytest.approx((300 + 300 + 500 + 500) / 1e3)
    text = F.format_report(json.loads(json.dumps(r)))
    assert "does not match" in text and "whole-step figures only" in text


def test_report_is_json_and_formats_with_ideal_and_top_kernels():
    r = P.report(pipeline_devices(True), LABELS, ideal_s=0.002, step_s=0.006, top_n=1)
    r = json.loads(json.dumps(r))
    assert r["step_over_ideal"] == pytest.approx(3.0)
    assert [x["name"] for x in r["top_kernels"]["gemm"]] == ["nvjet_gemm"]
    top = r["top_kernels"]["gemm"][0]
    assert top["count"] == 8 and top["mean_us"] == pytest.approx(400.0)
    assert r["unclassified"] == []
    assert r["devices"]["0"]["idle_after_d2h_ms"] == pytest.approx(5 * 0.005)
    text = F.format_report(r)
    assert "step / ideal 3.00" in text and "| gemm | nvjet_gemm | 8 |" in text
    assert "GPU0 5" in text


# ------------------------------------------------------------------------------ CLI helpers

class FakeOp(NamedTuple):
    kind: str
    microbatch: int = 0
    chunk: int = 0
    half: str = "full"


def test_cli_ideal_labels_and_stage_map():
    cli = _load("benchmarks/profile_step.py", "profile_step")
    assert cli.ideal_step_s(0.623, (1, 4, 1), 16) == pytest.approx(0.623 / 4 * 19 / 16)
    assert cli.ideal_step_s(1.0, (2, 4, 1), 8, 2, "interleaved") == pytest.approx(1 / 8 * 19 / 16)
    assert cli.ideal_step_s(1.0, (2, 1, 2), 8) == pytest.approx(0.25)
    assert cli.stage_of_device((2, 2, 2)) == {0: 0, 1: 0, 2: 1, 3: 1, 4: 0, 5: 0, 6: 1, 7: 1}
    table = ((FakeOp("F"), None), (FakeOp("B", half="upper"), FakeOp("F")),
             (FakeOp("B", half="lower"), FakeOp("B", half="full")))
    assert cli.tick_labels(SimpleNamespace(table=table)) == [["F", "."], ["b", "F"], ["B", "B"]]
    # 1f1b-phased: one permute a row, so one tick a row, and no merging of permutes into one
    # boundary (an idle stage's rows run back to back)
    phased = ((FakeOp("F"), None), (None, FakeOp("F")), (None, FakeOp("B")), (FakeOp("B"), None))
    assert cli.tick_labels(SimpleNamespace(table=phased, p=2, m=1), "1f1b-phased") == \
        [["F", "."], [".", "F"], [".", "B"], ["B", "."]]
    assert cli.merge_busy_us("zb-phased") == 0 and cli.merge_busy_us("1f1b") == 100
    assert cli.ideal_step_s(1.0, (1, 4, 1), 8, 2, "1f1b-phased") == pytest.approx(1 / 4 * 19 / 16)
    assert cli.ideal_step_s(1.0, (1, 4, 1), 16, 2, "zb-phased") == pytest.approx(1 / 4 * 35 / 32)


def test_cli_lockstep_floor_from_kernel_time():
    """The floor is the busiest stage's kernels (no collectives, no idle) x (1 + bubble); the
    measured step is given against it, and each stage's kernels against the one-GPU share."""
    cli = _load("benchmarks/profile_step.py", "profile_step")
    ms = lambda work, coll, idle: {"gemm": work, "collective": coll, "idle": idle}
    rep = {"devices": {"0": {"stage": 0, "ms": ms(150.0, 200.0, 100.0)},
                       "1": {"stage": 1, "ms": ms(160.0, 10.0, 280.0)}}}
    text = cli.lockstep_floor(rep, (1, 2, 1), m=16, one_gpu_step_s=0.25, step_s=0.18)
    assert "| 1 | 160.00 | 1.28 |" in text                  # 160 ms against 250 / 2
    assert "floor 170.0 ms" in text                          # 160 x (1 + 1/16)
    assert "1.06x the floor" in text                         # 180 / 170
    text = cli.lockstep_floor(rep, (1, 2, 1), m=4, v=2, schedule="interleaved")
    assert "floor 180.0 ms" in text and "share" not in text  # 160 x (1 + 1/8)


def test_cli_collectives_by_op_per_device():
    """The collective kernels' time per HLO op and device: the one that waits shows it."""
    cli = _load("benchmarks/profile_step.py", "profile_step")
    ar, sr = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)", "ncclDevKernel_SendRecv(x)"
    devs = kernels({0: [k("gemm_a", 0.0, 50.0), k(ar, 50.0, 5.0, hlo_op="all-reduce.3"),
                        k(sr, 60.0, 2.0, hlo_op="cp.1"), k(ar, 70.0, 5.0, hlo_op="all-reduce.3")],
                    1: [k("gemm_a", 0.0, 20.0), k(ar, 20.0, 35.0, hlo_op="all-reduce.3"),
                        k(sr, 60.0, 2.0, hlo_op="cp.1")]})
    text = cli.collectives_by_op(devs)
    rows = [r for r in text.splitlines() if r.startswith("| all-reduce.3") or r.startswith("| cp.1")]
    assert rows[0] == "| all-reduce.3 | AllReduce_Sum_bf16_RING_LL | 2 | 0.01 | 0.04 |"
    assert rows[1] == "| cp.1 | SendRecv | 1 | 0.00 | 0.00 |"


def test_cli_trace_fidelity_flags_a_slow_trace_and_kernels_beside_nccl():
    """A window far longer than the timed step says its waits are the profiler's; compute
    kernels that overlap an NCCL kernel are counted apart (they run slower there)."""
    cli = _load("benchmarks/profile_step.py", "profile_step")
    sr = "ncclDevKernel_SendRecv(x)"
    devs = kernels({0: [k("gemm_a", 0.0, 1000.0), k(sr, 900.0, 2000.0, tid=2),
                        k("gemm_b", 1500.0, 3000.0), k("gemm_c", 5000.0, 500.0)]})
    text = cli.trace_fidelity(devs, window_ms=6.0, step_s=0.002)
    assert "3.00x the timed step" in text and "profiler's" in text
    assert "| 0 | 4.50 | 4.00 |" in text                       # gemm_a and gemm_b overlap it
    assert "profiler's" not in cli.trace_fidelity(devs, window_ms=6.0, step_s=0.0055)


def test_last_run_keeps_the_last_of_several_traced_steps():
    """Two steps in one trace (capture_step.py --trace-steps 2): the first skewed (device 1
    starts late, device 0 waits in a collective), a gap where no device runs, then the second;
    only the second's kernels are kept. Gaps inside a step (device 1 idle while device 0
    works) are shorter than the one between the steps and do not cut."""
    ar = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(x)"
    second = 100_000.0        # capture_step.py pauses 100 ms between the traced steps
    devs = kernels({0: [k("gemm_a", 0.0, 10.0), k(ar, 10.0, 300.0), k("gemm_b", 310.0, 10.0),
                        k("gemm_a", second, 10.0), k(ar, second + 10, 5.0),
                        k("gemm_b", second + 30, 10.0)],
                    1: [k("gemm_a", 290.0, 10.0), k(ar, 300.0, 10.0),
                        k("gemm_a", second + 1, 10.0), k(ar, second + 11, 4.0),
                        k("gemm_c", second + 60, 5.0)]})
    last = P.last_run(devs, 2)
    assert [x.ts_us for x in last[0]] == [second, second + 10, second + 30]
    assert [x.ts_us for x in last[1]] == [second + 1, second + 11, second + 60]
    assert P.last_run(devs, 1) is devs
    with pytest.raises(ValueError, match="expected 9 traced runs"):
        P.last_run(devs, 9)
    # runs that overlap (no pause every device idles through): refused, not cut inside a step
    close = kernels({0: [k("gemm_a", 0.0, 10.0), k("gemm_b", 600.0, 10.0)],
                     1: [k("gemm_a", 5.0, 10.0), k("gemm_b", 605.0, 10.0)]})
    with pytest.raises(ValueError, match=r"only 0 interval.*the longest: 0.58 ms.*the runs "
                                         r"overlap"):
        P.last_run(close, 2)
    # a long all-idle interval inside the first run (the profiler's start) is not the cut:
    # the latest pause is
    skewed = kernels({0: [k("gemm_a", 0.0, 10.0), k("gemm_b", 300_000.0, 10.0),
                          k("gemm_a", 350_000.0, 10.0)],
                      1: [k("gemm_a", 300_005.0, 10.0), k("gemm_a", 350_001.0, 10.0)]})
    assert [x.ts_us for x in P.last_run(skewed, 2)[0]] == [350_000.0]
    # steps traced back to back (capture_step.py --back-to-back): 2-3 ms of host time between
    # them, cut at BACK_TO_BACK_GAP_US; the default refuses them and names the flag
    b2b = kernels({0: [k("gemm_a", 0.0, 10_000.0), k("gemm_b", 12_500.0, 10_000.0)],
                   1: [k("gemm_a", 1.0, 10_000.0), k("gemm_b", 12_501.0, 10_000.0)]})
    with pytest.raises(ValueError, match="profile_step.py --back-to-back"):
        P.last_run(b2b, 2)
    assert [x.ts_us for x in P.last_run(b2b, 2, P.BACK_TO_BACK_GAP_US)[0]] == [12_500.0]


def test_host_time_sums_host_events_and_gpu_idle():
    """benchmarks/host_time.py: host events summed by name; a GPU's idle time is its step
    window less the union of its (overlapping) kernels."""
    H = _load("benchmarks/host_time.py", "host_time")
    trace = make_trace({0: [k("a", 0.0, 10.0), k("b", 5.0, 10.0, tid=2), k("c", 40.0, 10.0)]},
                       host_events=3)
    assert H.host_events(trace) == {"host": (3, 3e6)}
    assert H.gpu_busy(trace) == {0: (50.0, 25.0)}


def test_idle_gaps_grouped_by_the_kernels_around_them(tmp_path, capsys):
    """benchmarks/idle_gaps.py: a gap is time with no kernel running (overlaps merged), named
    by the kernel that ended last before it and the one after; short gaps are left out."""
    G = _load("benchmarks/idle_gaps.py", "idle_gaps")
    ks = kernels({0: [k("a", 0.0, 10.0), k("b", 5.0, 20.0, tid=2), k("MemcpyD2H", 60.0, 5.0),
                      k("c", 165.0, 10.0), k("a", 180.0, 10.0), k("MemcpyD2H", 290.0, 5.0),
                      k("c", 395.0, 1.0)]})[0]
    gs = G.gaps(ks, min_us=20.0)
    assert gs == [(35.0, "b", "MemcpyD2H"), (100.0, "MemcpyD2H", "c"),
                  (100.0, "a", "MemcpyD2H"), (100.0, "MemcpyD2H", "c")]
    assert G.grouped(gs)[0] == (200.0, 2, "MemcpyD2H", "c")
    f = tmp_path / "t.json"
    f.write_text(json.dumps(make_trace({0: [k("a", 0.0, 10.0), k("c", 100.0, 10.0)]})))
    assert G.main([str(f)]) == 0
    out = capsys.readouterr().out
    assert "1 gaps" in out and "| 0.09 | 1 | 90 | a | c |" in out


def test_nccl_timeline_times_each_collective_against_the_compute_beside_it(tmp_path, capsys):
    """benchmarks/nccl_timeline.py: steps cut at idle gaps over 1 ms; for each NCCL kernel of
    the chosen step, its start within the step, its length and the time with compute beside it
    (the union of the compute kernels, not their sum)."""
    T = _load("benchmarks/nccl_timeline.py", "nccl_timeline")
    step = [k("gemm_a", 0.0, 600.0), k("gemm_b", 100.0, 600.0, tid=2),
            k("ncclDevKernel_ReduceScatter_Sum_bf16", 400.0, 400.0, tid=3)]
    later = [dict(s, ts=s["ts"] + 5000.0) for s in step]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(make_trace({0: step + later})))
    ks = sorted(P.load_trace(str(f))[0], key=lambda x: x.ts_us)
    assert T.step_starts_us(ks) == [0.0, 5000.0]
    assert T.beside_us([x for x in ks if "nccl" not in x.name], 400.0, 800.0) == 300.0
    T.main([str(f)])
    out = capsys.readouterr().out
    assert "step 1 of 2: 0.8 ms" in out and "| 0.4 | 0.40 | 0.30 | ncclDevKernel_Reduce" in out


HLO = """HloModule m

%branch_0 (param.1: (bf16[2,1024,1024])) -> (bf16[2,1024,1024]) {
  %param.1 = (bf16[2,1024,1024]{2,1,0}) parameter(0)
  %gte.1 = bf16[2,1024,1024]{2,1,0} get-tuple-element(%param.1), index=0
  %copy.1 = bf16[2,1024,1024]{2,1,0} copy(%gte.1)
  ROOT %t = (bf16[2,1024,1024]{2,1,0}) tuple(%copy.1)
}

%body (p: (bf16[2,1024,1024], f32[4,256,256], s32[])) -> (bf16[2,1024,1024], f32[4,256,256], s32[]) {
  %p = (bf16[2,1024,1024]{2,1,0}, f32[4,256,256]{2,1,0}, s32[]) parameter(0)
  %c = (bf16[2,1024,1024]{2,1,0}) conditional(%i, %tp), branch_computations={%branch_0, %branch_1}
  %loop_dynamic_update_slice_fusion.3 = f32[4,256,256]{2,1,0} fusion(%a, %b), kind=kLoop, calls=%f
  %small = f32[4]{0} copy(%z)
  %dynamic_slice_fusion.7 = f32[256,256]{1,0} fusion(%a), kind=kCustom, calls=%address_computation
}

ENTRY %main (a: bf16[2,1024,1024]) -> bf16[2,1024,1024] {
  %a = bf16[2,1024,1024]{2,1,0} parameter(0)
  %w = (bf16[2,1024,1024]{2,1,0}) while(%t0), condition=%cond, body=%body
  ROOT %copy.9 = bf16[2,1024,1024]{2,1,0} copy(%a)
}
"""


def test_hlo_copies_groups_moves_and_finds_their_computations(tmp_path, capsys):
    """benchmarks/hlo_copies.py: copies, dynamic-(update-)slice fusions and transposes of at
    least --min-mb, by (kind, dtype, shape); --where names the computations and their callers."""
    H = _load("benchmarks/hlo_copies.py", "hlo_copies")
    groups = H.scan(HLO, min_mb=1.0)
    assert groups[("copy", "bf16", "2,1024,1024")][:2] == (2, pytest.approx(4.194304))
    assert groups[("copy", "bf16", "2,1024,1024")][2] == {"%branch_0", "%main"}
    assert groups[("dynamic-update-slice", "f32", "4,256,256")][0] == 1
    assert not any(k[2] == "4" for k in groups)                    # under --min-mb
    assert not any(k[2] == "256,256" for k in groups)     # a custom (cuBLAS) fusion: not a move
    text = H.where(HLO, "bf16[2,1024,1024]")
    assert "- %branch_0: 1 moves, called from ['%body (conditional)']" in text
    assert "- %main: 1 moves" in text and "copy(%gte.1)" in text
    f = tmp_path / "m.txt"
    f.write_text(HLO)
    H.main([str(f)])
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("| kind | dtype[shape] | count | MB each |")
    assert "| copy | bf16[2,1024,1024] | 2 | 4.2 | 2 |" in out


def test_kernel_diff_groups_kernels_by_family_and_sorts_by_difference(tmp_path, capsys):
    """benchmarks/kernel_diff.py: fusions grouped by HLO op without its numeric suffix, GEMMs by
    kernel name; per family the count and summed time of each step and the difference."""
    D = _load("benchmarks/kernel_diff.py", "kernel_diff")
    base = make_trace({0: [k("nvjet_a", 0.0, 100.0, hlo_op="cublas.1"),
                           k("loop_add_fusion_3", 100.0, 10.0, hlo_op="loop_add_fusion.3")]})
    other = make_trace({0: [k("nvjet_a", 0.0, 60.0, hlo_op="cublas.7"),
                            k("nvjet_a", 60.0, 60.0, hlo_op="cublas.8"),
                            k("loop_add_fusion_9", 120.0, 5.0, hlo_op="loop_add_fusion.9"),
                            k("loop_add_fusion_12", 125.0, 5.0, hlo_op="loop_add_fusion.12.1"),
                            k("memset32", 130.0, 1.0, hlo_op=""),
                            k("input_reduce_fusion_71", 131.0, 2.0, hlo_op="command_buffer_165"),
                            k("input_reduce_fusion_9", 133.0, 2.0, hlo_op="command_buffer_165")]})
    fb, cb, wb = D.step_families_of(P.step_kernels(base)[0])
    fo, co, wo = D.step_families_of(P.step_kernels(other)[0])
    assert fo[("gemm", "nvjet_a")] == (2, pytest.approx(0.12))
    assert fo[("elementwise", "loop_add_fusion")] == (2, pytest.approx(0.01))
    assert fb[("elementwise", "loop_add_fusion")] == (1, pytest.approx(0.01))
    assert fo[("elementwise", "input_reduce_fusion")] == (2, pytest.approx(0.004))
    assert (wb, wo) == (pytest.approx(0.11), pytest.approx(0.135))
    assert cb["gemm"] == pytest.approx(0.1) and co["gemm"] == pytest.approx(0.12)
    rows = D.compare(fb, fo, top=10)
    assert rows[0][:3] == ("gemm", "nvjet_a", 1) and rows[0][6] == pytest.approx(0.02)
    assert [r[1] for r in rows][-1] == "loop_add_fusion"          # no difference: last
    for i, t in enumerate((base, other)):
        (tmp_path / f"{i}.json").write_text(json.dumps(t))
    assert D.main([str(tmp_path / "0.json"), str(tmp_path / "1.json"), "--trace-steps", "1",
                   "--names", "mb8,mb1"]) == 0
    out = capsys.readouterr().out
    assert "| gemm | `nvjet_a` | 1 | 0.10 | 2 | 0.12 | +0.02 |" in out
    assert "window: mb8 0.1 ms, mb1 0.1 ms" in out


def test_exposed_copies_counts_copy_time_with_nothing_above_it(tmp_path, capsys):
    """benchmarks/exposed_copies.py: per copy kernel name, its time with no GEMM, attention or
    element-wise kernel running (a peer copy half under a GEMM counts half; a slice fusion
    alone counts whole; a copy beside an element-wise kernel counts nothing)."""
    E = _load("benchmarks/exposed_copies.py", "exposed_copies")
    specs = [k("nvjet_sm90_tst_128x128", 0.0, 100.0), k("MemcpyP2P", 50.0, 100.0, tid=2),
             k("loop_dynamic_slice_fusion_1", 200.0, 60.0),
             k("loop_add_fusion", 300.0, 50.0), k("loop_concatenate_fusion", 310.0, 20.0, tid=2)]
    out = E.exposed_by_name(kernels({0: specs})[0])
    assert out == {"MemcpyP2P": 50.0, "loop_dynamic_slice_fusion_1": 60.0,
                   "loop_concatenate_fusion": 0.0}
    f = tmp_path / "t.json"
    f.write_text(json.dumps(make_trace({0: specs})))
    E.main([str(f), "--steps", "1"])
    text = capsys.readouterr().out
    assert "GPU0" in text and "(total 0.11)" in text and "0.06  loop_dynamic_slice_fusion_1" in text
