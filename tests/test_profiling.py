"""Tests of the step-trace analysis (benchmarks/profiling.py) on synthetic perfetto traces:
no GPU, no jax."""
from __future__ import annotations

import gzip
import json

import pytest

from trace_fakes import BIG, MODULE, F, P, k, kernels, make_trace


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
