"""ptdp-plan against our own measurements on H100 and H200 (benchmarks/RESULTS.md,
benchmarks/results/), each table with its session and lease. CPU only, no compile."""
import importlib.util
import json

import pytest

from ptdp_jax.config import load_config, parse_cli_overrides
from ptdp_jax.pipeline.schedule import build_schedule
from ptdp_jax.plan import plan
from ptdp_jax.plan import cost as plan_cost
from ptdp_jax.plan.estimate import estimate_step
from ptdp_jax.plan.hardware import gpu_kind, with_overrides

from plan_cases import H100, H200_BEFORE_S36, ROOT, config


# ----------------------------------------------------------------------------- our measurements

B13 = dict(train__micro_batch_size=1)
# (config, overrides, measured step s on 4x H100 80GB HBM3, 2026-11-26, benchmarks/RESULTS.md)
DYN = dict(parallel__static_stash=False)     # measured before the static stash
H100_MEASURED = [
    ("bench-1.3b", dict(train__micro_batch_size=8), 0.6236),
    ("bench-1.3b", dict(**B13, **DYN, parallel__pipe=4), 0.2446),
    ("bench-1.3b", dict(**B13, **DYN, parallel__pipe=4, parallel__schedule="interleaved",
                        parallel__virtual_stages=2), 0.2882),
    ("gpt-7.5b", dict(**B13, **DYN, parallel__pipe=4, parallel__data=1, parallel__tensor=1,
                      train__global_batch_size=32, train__recompute="selective"), 1.908),
]


@pytest.mark.parametrize("name,overrides,measured_s", H100_MEASURED,
                         ids=["1gpu", "141-1f1b", "141-interleaved2", "7.5b-141-1f1b"])
def test_our_h100_measurements(name, overrides, measured_s, monkeypatch):
    _attention_recomputed(monkeypatch)          # measured before selective kept it
    est = estimate_step(config(name, **overrides), H100, 8)
    assert est.step_time_s == pytest.approx(measured_s, rel=0.15)


# (1,2,1) m 16 on 2x H100, session 11 (RESULTS.md), the residual stash both ways
PH = dict(B13, parallel__pipe=2, parallel__schedule="1f1b-phased")
STASH_MEASURED = [
    (dict(PH, parallel__static_stash=False), 0.4009),
    (PH, 0.3759),
    (dict(PH, train__recompute="none", parallel__static_stash=False), 0.4739),
    (dict(PH, train__recompute="none"), 0.3981),
    (dict(B13, parallel__pipe=2, parallel__static_stash=False), 0.4205),
    (dict(B13, parallel__pipe=2), 0.4172),
]


def _attention_recomputed(monkeypatch):
    """The model of the code measured before session 12: selective recomputation ran the flash
    attention's forward again in the backward."""
    monkeypatch.setattr(plan_cost, "flash_attention_bytes_per_token", lambda cfg: 0.0)


@pytest.mark.parametrize("overrides,measured_s", STASH_MEASURED,
                         ids=["phased-dyn", "phased-static", "phased-none-dyn",
                              "phased-none-static", "1f1b-dyn", "1f1b-static"])
def test_static_stash_measurements(overrides, measured_s, monkeypatch):
    """The static stash leaves static_stash_copy_share of the indexed stash's copy passes."""
    _attention_recomputed(monkeypatch)
    est = estimate_step(config("bench-1.3b", **overrides), H100, 8)
    assert est.step_time_s == pytest.approx(measured_s, rel=0.08)


# session 14, 4x H200, one lease (benchmarks/results/2026-11-26-s14): the current code, each
# layout the planner searches; (d, p, t), overrides, measured step s
NONE_SP = dict(train__recompute="none", parallel__sequence_parallel=True)
H200_S14 = [
    ("bench-1.3b", (1, 1, 1), dict(train__micro_batch_size=8, train__recompute="none"), 0.5301),
    ("bench-1.3b", (1, 4, 1), dict(B13, parallel__schedule="1f1b-phased"), 0.2011),
    ("bench-1.3b", (4, 1, 1), dict(train__micro_batch_size=4, train__recompute="none"), 0.1641),
    ("bench-1.3b", (1, 1, 4), dict(NONE_SP, train__micro_batch_size=16), 0.2097),
    ("bench-1.3b", (2, 1, 2), dict(NONE_SP, train__micro_batch_size=8), 0.1798),  # cuDNN's
    ("bench-1.3b", (1, 2, 2), dict(NONE_SP, train__micro_batch_size=2,            # attention
                                   parallel__schedule="1f1b-phased"), 0.2601),
    ("gpt-7.5b", (1, 1, 4), dict(NONE_SP, train__global_batch_size=32, train__micro_batch_size=8),
     1.7523),
    # the data-parallel traffic by parallel.grad_reduce_dtype and parallel.zero
    ("bench-1.3b", (4, 1, 1), dict(train__micro_batch_size=4, train__recompute="none",
                                   parallel__grad_reduce_dtype="bfloat16"), 0.1554),
    ("bench-1.3b", (4, 1, 1), dict(train__micro_batch_size=4, train__recompute="none",
                                   parallel__zero=1, parallel__overlap_grad_reduce=False), 0.1646),
    ("gpt-7.5b", (4, 1, 1), dict(B13, train__global_batch_size=32, parallel__zero=3,
                                 train__recompute="none", train__scan_layers=False), 2.4872),
    ("gpt-7.5b", (4, 1, 1), dict(B13, train__global_batch_size=32, parallel__zero=3,
                                 train__recompute="selective", train__scan_layers=False), 2.5685),
]


# session 18, 4x H200 (benchmarks/results/2026-11-27-s18/a, b): zb-phased, now searched
H200_S18 = [
    ("bench-1.3b", (1, 4, 1), dict(B13, parallel__schedule="zb-phased"), 0.1882),
    ("gpt-7.5b", (1, 4, 1), dict(B13, train__global_batch_size=32, train__recompute="selective",
                                 parallel__schedule="zb-phased"), 1.5293),
]


@pytest.mark.parametrize("name,mesh,overrides,measured_s", H200_S14 + H200_S18,
                         ids=["1gpu", "141-phased", "411", "114-sp", "212-sp", "122-sp",
                              "7.5b-114-sp", "411-bf16", "411-zero1",
                              "7.5b-411-zero3-none", "7.5b-411-zero3-sel", "141-zbphased",
                              "7.5b-141-zbphased"])
def test_our_h200_measurements(name, mesh, overrides, measured_s):
    d, p, t = mesh
    cfg = config(name, **overrides, parallel__data=d, parallel__pipe=p, parallel__tensor=t)
    est = estimate_step(cfg, H200_BEFORE_S36, 8)
    assert est.step_time_s == pytest.approx(measured_s, rel=0.12)


def test_selective_keeps_the_flash_attention():
    """Session 12, 2x H100, one lease: (1,2,1) 1f1b-phased selective 0.3710 s with the
    attention forward run again, 0.3625 s with its outputs kept."""
    est = estimate_step(config("bench-1.3b", **PH), H100, 8)
    assert est.step_time_s == pytest.approx(0.3625, rel=0.08)


# session 20, 4x H100 (benchmarks/results/2026-11-27-s20): the phased schedules at v > 1, with
# each phased row's overhead and the weight gradients' float32 sums (plan/hardware.py)
Q75 = dict(B13, train__global_batch_size=32, train__recompute="selective", parallel__pipe=4,
           parallel__data=1, parallel__tensor=1)
H100_S20 = [
    ("bench-1.3b", dict(B13, parallel__pipe=4, parallel__schedule="1f1b-phased",
                        parallel__virtual_stages=2), 0.2020),
    ("bench-1.3b", dict(B13, parallel__pipe=4, parallel__schedule="zb-phased",
                        parallel__virtual_stages=2), 0.1931),
    ("gpt-7.5b", dict(Q75, parallel__schedule="1f1b-phased", parallel__virtual_stages=3), 1.5682),
    ("gpt-7.5b", dict(Q75, parallel__schedule="zb-phased", parallel__virtual_stages=3), 1.5569),
]


@pytest.mark.parametrize("name,overrides,measured_s", H100_S20,
                         ids=["141-phased-v2", "141-zbphased-v2", "7.5b-phased-v3",
                              "7.5b-zbphased-v3"])
def test_our_h100_s20_measurements(name, overrides, measured_s):
    est = estimate_step(config(name, **overrides), H100, 8)
    assert est.step_time_s == pytest.approx(measured_s, rel=0.06)


def test_a_phased_row_costs_the_row_overhead():
    """A tiny GPT (kernels of a few us) at (1,4,1) zb-phased v 2 on 4x H100, session 20: m 16
    12.1 ms and m 32 22.0 ms a step, so 0.155 ms a row (70 and 134 rows). The older executor's
    ticks cost 0.39 ms; phased rows pay row_overhead_s, not tick_overhead_s."""
    def step_and_rows(gb):
        cfg = config("tiny-gpt", train__global_batch_size=gb, train__micro_batch_size=1,
                     parallel__pipe=4, parallel__schedule="zb-phased", parallel__virtual_stages=2)
        rows = build_schedule("zb-phased", 4, gb, 2).num_ticks
        return estimate_step(cfg, H100, 8).step_time_s, rows
    (t16, r16), (t32, r32) = step_and_rows(16), step_and_rows(32)
    assert (r16, r32) == (70, 134)
    assert (t32 - t16) / (r32 - r16) == pytest.approx(0.155e-3, rel=0.2)
    assert H100.row_overhead_s < H100.tick_overhead_s / 2


def test_pipelined_backward_pays_the_float32_gradient_sums():
    """Each microbatch's weight gradients go into the float32 sums in the GEMM (beta 1): the
    pipelined backward pays wgrad_accumulate_exposed of 8 bytes per layer weight, which grows
    with h^2 (7.5B: ~0.24 ms a layer and microbatch on H100); without pipelining it is not
    there (the microbatch loop's sums are accumulate_seconds)."""
    def bwd(name, **kw):
        return plan_cost.op_costs(config(name, **B13, **kw), H100, 8).layer_bwd
    def bwd_without(name, **kw):
        off = with_overrides(H100, {"wgrad_accumulate_exposed": 0.0})
        return plan_cost.op_costs(config(name, **B13, **kw), off, 8).layer_bwd
    pp4 = dict(parallel__pipe=4, parallel__tensor=1, parallel__data=1)
    extra = bwd("gpt-7.5b", **pp4) - bwd_without("gpt-7.5b", **pp4)
    assert extra == pytest.approx(0.5 * 8 * 12 * 4096 ** 2 / 3.35e12, rel=0.01)
    tp4 = dict(pp4, parallel__tensor=4)          # a tensor rank sums its shard only
    assert bwd("gpt-7.5b", **tp4) - bwd_without("gpt-7.5b", **tp4) == pytest.approx(extra / 4)
    one = dict(pp4, parallel__pipe=1)
    assert bwd("gpt-7.5b", **one) == bwd_without("gpt-7.5b", **one)


# session 21, 4x H200 (benchmarks/results/2026-11-27-s21): micro 1, 2 and 4 on the 7.5B with the
# row overhead and the float32 gradient sums priced as on H100 (one executor, plan/hardware.py)
H200_S21 = [
    ("gpt-7.5b", dict(Q75, parallel__schedule="zb-phased", parallel__virtual_stages=3), 1.4983),
    ("gpt-7.5b", dict(Q75, parallel__schedule="zb-phased", parallel__virtual_stages=3,
                      train__micro_batch_size=2), 1.4674),
    ("gpt-7.5b", dict(Q75, parallel__schedule="zb-phased", parallel__virtual_stages=3,
                      train__micro_batch_size=4), 1.5075),
    ("gpt-7.5b", dict(Q75, parallel__schedule="1f1b-phased", parallel__virtual_stages=3,
                      train__micro_batch_size=2), 1.5067),
    ("gpt-7.5b", dict(Q75, parallel__schedule="1f1b-phased"), 1.5681),
]


@pytest.mark.parametrize("name,overrides,measured_s", H200_S21,
                         ids=["zb-v3-mb1", "zb-v3-mb2", "zb-v3-mb4", "phased-v3-mb2",
                              "phased-v1"])
def test_our_h200_s21_measurements(name, overrides, measured_s):
    est = estimate_step(config(name, **overrides), H200_BEFORE_S36, 8)
    assert est.step_time_s == pytest.approx(measured_s, rel=0.03)


def test_h200_ranks_micro_2_first_on_the_7_5b_pipeline():
    """Measured in session 21 on 4x H200: zb-phased v 3 at micro 2 (1.4674 s) beat micro 1
    (1.4983) and micro 4 (1.5075); the planner's order of the three agrees."""
    def step(mb):
        cfg = config("gpt-7.5b", **dict(Q75, parallel__schedule="zb-phased",
                                        parallel__virtual_stages=3, train__micro_batch_size=mb))
        return estimate_step(cfg, gpu_kind("h200"), 8).step_time_s
    assert step(2) < min(step(1), step(4))


def test_h200_tick_interleaved_priced_above_the_phased_schedules():
    """Session 14's 7.5B (1,4,1) interleaved v 3 on 4x H200 (the tick executor) took 1.8181 s;
    session 21's zb-phased v 3 1.4983 s. Since the float32 gradient sums are priced on H200
    (session 21) the tick schedule is predicted ~16% above its old measurement (its fit had
    held them at 0); the planner still ranks it behind the phased schedules, as measured (the
    figures against the kind of their time, the order with today's too)."""
    def step(schedule, gpu=H200_BEFORE_S36):
        cfg = config("gpt-7.5b", **dict(Q75, parallel__schedule=schedule,
                                        parallel__virtual_stages=3))
        return estimate_step(cfg, gpu, 8).step_time_s
    tick, zb = step("interleaved"), step("zb-phased")
    assert zb == pytest.approx(1.4983, rel=0.03) and tick > 1.8181 > zb
    assert step("interleaved", gpu_kind("h200")) > 1.8181 > step("zb-phased", gpu_kind("h200"))


# session 22, 1x H100 (benchmarks/results/2026-11-27-s22x2/h100_mastergrad): p = 1 with the
# GEMM weights' float32 sums inside the GEMM; the MLP activation kept (selective's default)
H100_S22 = [
    (dict(B13, train__micro_batch_size=1, train__keep_ffn_activation="auto"), 0.6356),
    (dict(B13, train__micro_batch_size=8, train__keep_ffn_activation="auto"), 0.5444),
    (dict(B13, train__micro_batch_size=8, train__recompute="none"), 0.5365),
]


@pytest.mark.parametrize("overrides,measured_s", H100_S22, ids=["sel-mb1", "sel-mb8", "none-mb8"])
def test_our_h100_s22_one_gpu_measurements(overrides, measured_s):
    est = estimate_step(config("bench-1.3b", **overrides), H100, 8)
    assert est.step_time_s == pytest.approx(measured_s, rel=0.06)


def test_unrolled_p1_sums_in_the_gemm():
    """Without pipelining, micro 1 m 16 on one GPU: the unrolled loop adds the GEMM weights'
    gradients in the GEMM (half of 8 bytes a weight a microbatch exposed), a layer scan in
    separate passes (10 bytes a weight for m - 1 microbatches)."""
    from ptdp_jax.plan.cost import accumulate_seconds
    unrolled = config("bench-1.3b", **dict(B13, train__micro_batch_size=1))
    scanned = config("bench-1.3b", **dict(B13, train__micro_batch_size=1,
                                          train__scan_layers=True))
    assert accumulate_seconds(unrolled, H100) < 0.55 * accumulate_seconds(scanned, H100)


# session 29, 4x H100 80GB HBM3, one machine (benchmarks/results/2026-11-27-s29): every
# capture_step.py case of the lease, read from its record.jsonl as run (the code's defaults
# then) by benchmarks/plan_vs_measured.py. Predicted / measured step 0.97-1.09 (1f1b 1.09,
# (1,1,4) micro 16 1.09); peak memory 0.99-1.17 (the estimate over at m = 1 with data or
# tensor parallelism: on the safe side).
RESULTS = ROOT / "benchmarks" / "results"


def records(day: str, parts, keep=lambda line: True) -> list[dict]:
    """The measured cases (lines with a mesh) of benchmarks/results/DAY/PART/record.jsonl."""
    return [json.loads(line) for part in parts
            for line in (RESULTS / day / part / "record.jsonl").read_text().splitlines()
            if '"mesh"' in line and keep(line)]


S29 = RESULTS / "2026-11-27-s29"
S29_CASES = records("2026-11-27-s29", ("z", "e", "zh"))


def _plan_vs_measured():
    spec = importlib.util.spec_from_file_location(
        "plan_vs_measured", ROOT / "benchmarks" / "plan_vs_measured.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", S29_CASES, ids=[c["tag"] for c in S29_CASES])
def test_our_h100_s29_measurements(case):
    assert "H100" in case["device"]
    # the defaults then: the tensor ring (auto) became the default in session 31
    case = dict(case, overrides=case["overrides"] + ["parallel.tp_comm_overlap=false"])
    step, gib = _plan_vs_measured().predict(case)
    assert step == pytest.approx(case["step_time_s"], rel=0.10)
    assert 0.97 <= gib / max(case["peak_mem_gib"]) <= 1.20


def test_plan_vs_measured_names_records_it_cannot_predict():
    """bench_train.py lines before session 29 carry no overrides: said, not mispredicted."""
    out = _plan_vs_measured().rows([str(S29 / "zc" / "record.jsonl")])
    train_rows = [r for r in out if "-train |" in r]
    assert len(train_rows) == 3 and all("no overrides" in r for r in train_rows)
    assert any("| 1gpu-none-mb4 |" in r and "| 0.5560 |" in r for r in out)


# the tensor ring (parallel.tp_comm_overlap, on under auto at m = 1): sessions 31-32 on 4x H100
# and session 33 on 2x H200, every ring case of those calls as run; the planner counts
# tp_ring_share(t) of the tensor collectives, the memory model no gathered GEMM inputs
RING_RUNS = [("2026-11-28-s31", "c"), ("2026-11-28-s32", "d"), ("2026-11-28-s33", "d")]
RING_CASES = [case for day, part in RING_RUNS for case in records(
    day, (part,), lambda line: "sequence_parallel=true" in line and "-dsf" not in line)]


@pytest.mark.parametrize("case", RING_CASES, ids=[c["tag"] for c in RING_CASES])
def test_tensor_ring_measurements(case):
    step, gib = _plan_vs_measured().predict(case)
    assert step == pytest.approx(case["step_time_s"], rel=0.10)
    assert 0.95 <= gib / max(case["peak_mem_gib"]) <= 1.10


def test_tensor_ring_cheaper_than_plain_at_m1_only():
    from ptdp_jax.plan.cost import tp_ring_share
    sp = dict(B13, train__micro_batch_size=16, train__recompute="none",
              parallel__sequence_parallel=True)
    ring = estimate_step(config("bench-1.3b", **dict(sp, parallel__tensor=4)), H100, 8)
    plain = estimate_step(config("bench-1.3b", **dict(sp, parallel__tensor=4,
                                                      parallel__tp_comm_overlap=False)), H100, 8)
    assert ring.step_time_s < plain.step_time_s and ring.memory.total < plain.memory.total
    assert tp_ring_share(2) == 0.5 and tp_ring_share(4) == 0.75
    forced = dict(sp, train__micro_batch_size=4, parallel__tensor=4)     # m = 4: counted whole
    on = estimate_step(config("bench-1.3b", **dict(forced, parallel__tp_comm_overlap=True)),
                       H100, 8)
    off = estimate_step(config("bench-1.3b", **dict(forced, parallel__tp_comm_overlap=False)),
                        H100, 8)
    assert on.pipeline_s == pytest.approx(off.pipeline_s)


# session 34, 4x H200 (benchmarks/results/2026-11-28-s34 d, e): the (1,2,2) sequence-parallel
# zb-phased layouts ptdp-plan ranks first, as run (v 4 micro 8 twice)
S34_122 = records("2026-11-28-s34", ("d", "e"), lambda line: '"mesh": [1, 2, 2]' in line)


def test_h200_orders_the_measured_1_2_2_layouts():
    """Measured: v 4 micro 8 0.1906 / 0.1911 s, v 3 micro 4 0.2040, v 2 micro 8 0.2054, v 4
    micro 8 without recomputation 0.2102 (selective faster: the stash of a none layer is
    twice the size). The planner puts them in that order (it over-predicts each by 1.09-1.17
    on H200, as every 4-GPU case of that session), its memory within 0-7% above."""
    measured, predicted, pvm = {}, {}, _plan_vs_measured()
    for case in S34_122:
        key = " ".join(sorted(o for o in case["overrides"] if "virtual" in o or "micro" in o
                              or "recompute" in o))
        step, gib = pvm.predict(case)
        measured.setdefault(key, []).append(case["step_time_s"])
        predicted[key] = step
        assert 1.0 <= gib / max(case["peak_mem_gib"]) <= 1.07, (key, gib)
    assert len(measured) == 4
    by_measured = sorted(measured, key=lambda k: sum(measured[k]) / len(measured[k]))
    assert by_measured == sorted(predicted, key=predicted.get), (measured, predicted)


def test_h200_plan_picks_the_fastest_measured_1_2_2_layout():
    """Pinned to (1,2,2) with sequence parallelism, ptdp-plan recommends the layout measured
    fastest there in session 34: zb-phased v 4, micro 8, selective (1.37x (4,1,1) zero 2;
    session 27's 1f1b-phased micro 2 was 1.69x)."""
    cfg = load_config(str(ROOT / "configs" / "bench-1.3b.yaml"),
                      {"parallel.sequence_parallel": True})
    top = plan(cfg, 4, "h200", 8, fixed={"parallel.data": 1, "parallel.pipe": 2,
                                         "parallel.tensor": 2})[0]
    assert (top.schedule, top.virtual_stages, top.micro_batch_size, top.recompute) == (
        "zb-phased", 4, 8, "selective"), top


# sessions 33-36 on 4x (s33 a-d: 2x) H200, as run (benchmarks/results/2026-11-28-sNN/PART/
# record.jsonl; their defaults are today's): one or two cases a layout of the 60 the h200 kind's
# memory_bound_bytes_per_s was refitted to in session 36 (results/2026-11-28-s36/planner_h200.md:
# all 60 at 0.935-1.075, median 1.004). (d, p, t), overrides, measured step s; session, part, tag
SP_NONE = "parallel.sequence_parallel=true train.recompute=none "
SP_ZB = "parallel.sequence_parallel=true parallel.schedule=zb-phased train.recompute=selective "
DP_Z2 = "train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2 "
H200_S33_S36 = [
    ((1, 1, 1), "train.micro_batch_size=8 train.recompute=none", 0.5139),      # s35 a 1gpu-none-mb8
    ((1, 1, 1), "train.micro_batch_size=8 train.recompute=none", 0.5330),      # s35 e ...-gpu0
    ((2, 1, 1), DP_Z2 + "train.micro_batch_size=8", 0.2655),                    # s33 d dp2-zero2
    ((1, 1, 2), SP_NONE + "train.micro_batch_size=16", 0.2911),                 # s33 d tp2-...-auto
    ((1, 1, 2), SP_NONE + "train.micro_batch_size=16 parallel.tp_comm_overlap=false",
     0.3123),                                                                   # s36 c tp2-noring-r1
    ((4, 1, 1), DP_Z2 + "train.micro_batch_size=4", 0.1364),                    # s35 a dp4-zero2
    ((2, 1, 2), SP_NONE + "train.micro_batch_size=8 parallel.grad_reduce_dtype=bfloat16",
     0.1588),                                                                   # s35 a tp212-sp-mb8
    ((2, 1, 2), SP_NONE + "train.micro_batch_size=8 parallel.grad_reduce_dtype=bfloat16 "
     "parallel.zero=2", 0.1628),                                                # s35 a ...-zero2
    ((1, 1, 4), SP_NONE + "train.micro_batch_size=16", 0.1816),                 # s35 a tp4-sp-mb16
    ((1, 2, 2), SP_ZB + "train.micro_batch_size=8 parallel.virtual_stages=4", 0.1886),  # s35 a
    ((1, 2, 2), SP_ZB + "train.micro_batch_size=4 parallel.virtual_stages=3", 0.2040),  # s34 d
    ((1, 2, 2), SP_ZB.replace("selective", "none") + "train.micro_batch_size=8 "
     "parallel.virtual_stages=4", 0.2102),                                      # s34 e ...-none
    ((1, 2, 2), SP_ZB.replace("zb-", "1f1b-") + "train.micro_batch_size=8 "
     "parallel.virtual_stages=4", 0.1924),                                      # s35 g pp2tp2-ph-v4
]


def _h200_s33_s36_step(mesh, overrides, name="bench-1.3b"):
    d, p, t = mesh
    keys = overrides.split() + [f"parallel.data={d}", f"parallel.pipe={p}", f"parallel.tensor={t}"]
    cfg = load_config(str(ROOT / "configs" / f"{name}.yaml"), parse_cli_overrides(keys))
    return estimate_step(cfg, gpu_kind("h200"), 8).step_time_s


@pytest.mark.parametrize("mesh,overrides,measured_s", H200_S33_S36, ids=[
    "1gpu", "1gpu-slow", "211-z2", "112-ring", "112-plain", "411-z2", "212", "212-z2", "114",
    "122-zb-v4", "122-zb-v3-mb4", "122-zb-v4-none", "122-phased-v4"])
def test_h200_s33_s36_measurements(mesh, overrides, measured_s):
    assert _h200_s33_s36_step(mesh, overrides) == pytest.approx(measured_s, rel=0.08)


def test_h200_7_5b_out_of_the_fit():
    """Session 36 parts e and f (4x H200, today's code; not among the cases the h200 kind was
    refitted to): the 7.5B (4,1,1) zero 2 micro 8 selective bf16 1.3137 and 1.3041 s."""
    step = _h200_s33_s36_step((4, 1, 1), "train.global_batch_size=32 train.micro_batch_size=8 "
                              "train.recompute=selective parallel.zero=2 "
                              "parallel.grad_reduce_dtype=bfloat16", "gpt-7.5b")
    assert step == pytest.approx(1.3089, rel=0.05)


def test_h200_orders_the_4_gpu_layouts_as_measured():
    """Session 35 part a, one 4x H200 machine: (4,1,1) zero 2 0.1364 < (2,1,2) 0.1588 < (1,1,4)
    0.1816 < (1,2,2) zb-phased v 4 0.1886 s; the planner's order is the same."""
    rows = {r[0]: r for r in H200_S33_S36[5:10] if r[0] != (2, 1, 2) or "zero=2" not in r[1]}
    steps = {mesh: _h200_s33_s36_step(mesh, o) for mesh, (_, o, _) in rows.items()}
    measured = {mesh: m for mesh, (_, _, m) in rows.items()}
    assert sorted(steps, key=steps.get) == sorted(measured, key=measured.get) == [
        (4, 1, 1), (2, 1, 2), (1, 1, 4), (1, 2, 2)]
