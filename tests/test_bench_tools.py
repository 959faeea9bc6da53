"""Tests of the benchmark tools that read step traces and HLO (benchmarks/profile_step.py,
trace_tools.py, hlo_copies.py) on synthetic inputs: no GPU, no jax (bench_train.py runs in a
subprocess on 2 fake CPU devices)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from types import SimpleNamespace
from typing import NamedTuple

import pytest

from trace_fakes import ROOT, P, k, kernels, load as _load, make_trace


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


def test_host_time_sums_host_events_and_gpu_idle():
    """trace_tools.py host: host events summed by name; a GPU's idle time is its step
    window less the union of its (overlapping) kernels."""
    H = _load("benchmarks/trace_tools.py", "trace_tools")
    trace = make_trace({0: [k("a", 0.0, 10.0), k("b", 5.0, 10.0, tid=2), k("c", 40.0, 10.0)]},
                       host_events=3)
    assert H.host_events(trace) == {"host": (3, 3e6)}
    assert H.gpu_busy(trace) == {0: (50.0, 25.0)}


def test_idle_gaps_grouped_by_the_kernels_around_them(tmp_path, capsys):
    """trace_tools.py idle: a gap is time with no kernel running (overlaps merged), named
    by the kernel that ended last before it and the one after; short gaps are left out."""
    G = _load("benchmarks/trace_tools.py", "trace_tools")
    ks = kernels({0: [k("a", 0.0, 10.0), k("b", 5.0, 20.0, tid=2), k("MemcpyD2H", 60.0, 5.0),
                      k("c", 165.0, 10.0), k("a", 180.0, 10.0), k("MemcpyD2H", 290.0, 5.0),
                      k("c", 395.0, 1.0)]})[0]
    gs = G.gaps(ks, min_us=20.0)
    assert gs == [(35.0, "b", "MemcpyD2H"), (100.0, "MemcpyD2H", "c"),
                  (100.0, "a", "MemcpyD2H"), (100.0, "MemcpyD2H", "c")]
    assert G.grouped(gs)[0] == (200.0, 2, "MemcpyD2H", "c")
    f = tmp_path / "t.json"
    f.write_text(json.dumps(make_trace({0: [k("a", 0.0, 10.0), k("c", 100.0, 10.0)]})))
    assert G.main(["idle", str(f)]) == 0
    out = capsys.readouterr().out
    assert "1 gaps" in out and "| 0.09 | 1 | 90 | a | c |" in out


def test_nccl_timeline_times_each_collective_against_the_compute_beside_it(tmp_path, capsys):
    """trace_tools.py nccl: steps cut at idle gaps over 1 ms; for each NCCL kernel of
    the chosen step, its start within the step, its length and the time with compute beside it
    (the union of the compute kernels, not their sum)."""
    T = _load("benchmarks/trace_tools.py", "trace_tools")
    step = [k("gemm_a", 0.0, 600.0), k("gemm_b", 100.0, 600.0, tid=2),
            k("ncclDevKernel_ReduceScatter_Sum_bf16", 400.0, 400.0, tid=3)]
    later = [dict(s, ts=s["ts"] + 5000.0) for s in step]
    f = tmp_path / "t.json"
    f.write_text(json.dumps(make_trace({0: step + later})))
    ks = sorted(P.load_trace(str(f))[0], key=lambda x: x.ts_us)
    assert T.step_starts_us(ks) == [0.0, 5000.0]
    assert T.beside_us([x for x in ks if "nccl" not in x.name], 400.0, 800.0) == 300.0
    T.main(["nccl", str(f)])
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
    """trace_tools.py diff: fusions grouped by HLO op without its numeric suffix, GEMMs by
    kernel name; per family the count and summed time of each step and the difference."""
    D = _load("benchmarks/trace_tools.py", "trace_tools")
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
    assert D.main(["diff", str(tmp_path / "0.json"), str(tmp_path / "1.json"), "--trace-steps", "1",
                   "--names", "mb8,mb1"]) == 0
    out = capsys.readouterr().out
    assert "| gemm | `nvjet_a` | 1 | 0.10 | 2 | 0.12 | +0.02 |" in out
    assert "window: mb8 0.1 ms, mb1 0.1 ms" in out


def test_exposed_copies_counts_copy_time_with_nothing_above_it(tmp_path, capsys):
    """trace_tools.py copies: per copy kernel name, its time with no GEMM, attention or
    element-wise kernel running (a peer copy half under a GEMM counts half; a slice fusion
    alone counts whole; a copy beside an element-wise kernel counts nothing)."""
    E = _load("benchmarks/trace_tools.py", "trace_tools")
    specs = [k("nvjet_sm90_tst_128x128", 0.0, 100.0), k("MemcpyP2P", 50.0, 100.0, tid=2),
             k("loop_dynamic_slice_fusion_1", 200.0, 60.0),
             k("loop_add_fusion", 300.0, 50.0), k("loop_concatenate_fusion", 310.0, 20.0, tid=2)]
    out = E.exposed_by_name(kernels({0: specs})[0])
    assert out == {"MemcpyP2P": 50.0, "loop_dynamic_slice_fusion_1": 60.0,
                   "loop_concatenate_fusion": 0.0}
    f = tmp_path / "t.json"
    f.write_text(json.dumps(make_trace({0: specs})))
    E.main(["copies", str(f), "--steps", "1"])
    text = capsys.readouterr().out
    assert "GPU0" in text and "(total 0.11)" in text and "0.06  loop_dynamic_slice_fusion_1" in text


def test_bench_train_reports_the_layout_that_ran(tmp_path):
    """parallel.layout=auto: the mesh, micro batch and device count printed are the planner's
    (2 devices here), not the YAML's (1, 1, 1) with micro batch 8."""
    cfg = tmp_path / "tiny.yaml"
    cfg.write_text(
        "model: {arch: gpt, num_layers: 2, hidden_size: 32, num_heads: 4, seq_len: 16}\n"
        "train: {global_batch_size: 8, micro_batch_size: 8, warmup_steps: 1}\n"
        "parallel: {data: 1, pipe: 1, tensor: 1}\n"
        f"run: {{dir: {tmp_path / 'run'}}}\n")
    env = dict(os.environ, PYTHONPATH=ROOT, PTDP_NO_DISTRIBUTED="1", JAX_PLATFORMS="cpu",
               PTDP_CACHE_DIR=str(tmp_path / "data"),
               XLA_FLAGS="--xla_force_host_platform_device_count=2 "
                         "--xla_backend_optimization_level=0")
    r = subprocess.run([sys.executable, "benchmarks/bench_train.py", str(cfg), "--steps", "1",
                        "--skip", "0", "parallel.layout=auto"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    d, p, t = out["mesh"]
    assert d * p * t == 2 and len(out["peak_mem_gib"]) == 2
    assert out["m"] * out["micro_batch"] * d == out["global_batch"] == 8
