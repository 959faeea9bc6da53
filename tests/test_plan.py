"""ptdp-plan against the paper (../shared/PAPER.md), the tick-table players, the CLI and bad
input; our own measurements in tests/test_plan_measured.py and test_plan_records.py. CPU
only, no compile."""
import json

import pytest

from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.config.validation import validate
from ptdp_jax.exits import ExitCode
from ptdp_jax.training.metrics import paper_param_count, training_days
from ptdp_jax.pipeline.schedule import build_schedule
from ptdp_jax.plan import choose_layout, plan
from ptdp_jax.plan import cost as plan_cost, play
from ptdp_jax.cli.plan import main as plan_main
from ptdp_jax.plan.estimate import estimate_step
from ptdp_jax.plan.hardware import gpu_kind, with_overrides
from ptdp_jax.plan.search import over
from ptdp_jax.training.memory import GiB

from plan_cases import A100, H100, best, config

# ----------------------------------------------------------------------------- the paper's numbers

# Table 1: (config, printed parameter count in billions, its decimals, TFLOP/s per GPU)
TABLE1 = [("gpt-1.7b", 1.7, 1, 137), ("gpt-3.6b", 3.6, 1, 138), ("gpt-7.5b", 7.5, 1, 142),
          ("gpt-18.4b", 18.4, 1, 135), ("gpt-39.1b", 39.1, 1, 138), ("gpt-76.1b", 76.1, 1, 140),
          ("gpt-145.6b", 145.6, 1, 148), ("gpt-310.1b", 310.1, 1, 155),
          ("gpt-529.6b", 529.6, 1, 163), ("gpt-1t", 1008, 0, 163)]


@pytest.mark.parametrize("name,billions,decimals,_", TABLE1, ids=[r[0] for r in TABLE1])
def test_table1_parameter_counts(name, billions, decimals, _):
    """Within 0.5%, or equal at the table's printed precision (1.7B and 3.6B are printed with
    two digits: the formula gives 1.652B and 3.562B)."""
    count = paper_param_count(config(name)) / 1e9
    assert abs(count / billions - 1) <= 0.005 or round(count, decimals) == billions, count


def test_paper_training_time_examples():
    assert training_days(300e9, 175e9, 1024, 140e12) == pytest.approx(34, rel=0.05)
    assert training_days(450e9, 1e12, 3072, 163e12) == pytest.approx(84, rel=0.05)
    # the planner's days column agrees with 8 T P / (n X) at its own predicted X
    cfg = config("gpt3-175b", train__global_batch_size=1536)
    row = plan(cfg, 1024, A100, 8, tokens=300e9, fixed={
        "parallel.pipe": 16, "parallel.tensor": 8, "train.micro_batch_size": 1,
        "parallel.schedule": "interleaved", "parallel.virtual_stages": 2,
        "train.recompute": "full", "parallel.scatter_gather": True})[0]
    assert row.ok and row.data == 8
    j = row.to_json()
    formula = training_days(300e9, paper_param_count(cfg), 1024, j["tflops_per_gpu"] * 1e12)
    assert j["days"] == pytest.approx(formula, rel=0.05)


@pytest.mark.parametrize("name,_,__,paper_tflops", TABLE1, ids=[r[0] for r in TABLE1])
def test_table1_throughput_at_the_papers_layout(name, _, __, paper_tflops):
    est = estimate_step(config(name), A100, 8)
    assert est.tflops_per_gpu == pytest.approx(paper_tflops, rel=0.15)


# ----------------------------------------------------------------------------- the paper's findings

M162 = dict(model__num_layers=32, model__hidden_size=20480, model__num_heads=128,
            model__vocab_size=51200, model__seq_len=2048, train__dtype="bfloat16")
M59 = dict(model__num_layers=32, model__hidden_size=3840, model__num_heads=32,
           model__vocab_size=51200, model__seq_len=2048, train__dtype="bfloat16")


def test_162b_model_parameters():
    """The paper's 162.2B model: the 530B row's width (h 20480, 128 heads) with 32 layers."""
    assert paper_param_count(config(None, **M162)) / 1e9 == pytest.approx(162.2, rel=0.005)


# docs/planner.md's command for the 162B model: `ptdp-plan --gpus 64 --gpu a100 --batch B
# model.num_layers=32 ...` (the built-in defaults, no config file)
PAGE_162B = {"model.num_layers": 32, "model.hidden_size": 20480, "model.num_heads": 128,
             "model.vocab_size": 51200, "model.seq_len": 2048}


@pytest.mark.parametrize("zero", [None, 0], ids=["zero-searched", "zero-0"])
@pytest.mark.parametrize("batch", [32, 128, 512])
def test_162b_on_64_gpus_recommends_t8_p8_tensor_first_then_pipeline(batch, zero):
    """As docs/planner.md states: (t=8, p=8, d=1) at batch 32 and 128, and at 512 with
    parallel.zero=0 pinned (the paper's Megatron had no distributed optimizer); with ZeRO
    searched, batch 512 gets (d=2, p=4, t=8) with zero 1."""
    fixed = {} if zero is None else {"parallel.zero": zero}
    rows = plan(load_config(None, {**PAGE_162B, "train.global_batch_size": batch}), 64, A100,
                8, fixed=fixed)
    rec = rows[0]
    want = (2, 4, 8, 1) if batch == 512 and zero is None else (1, 8, 8, 0)
    assert rec.ok and (rec.data, rec.pipe, rec.tensor, rec.zero) == want
    # the paper's sweep at d = 1: tensor up to the host's 8 GPUs, then pipeline; past the host
    # the tensor group is rejected and slower
    step = {t: best(rows, tensor=t, pipe=64 // t, data=1).estimate.step_time_s
            for t in (2, 4, 8, 16, 32)}
    assert step[8] < step[4] < step[2] and step[8] < step[16] < step[32], step
    crossing = [r for r in rows if r.tensor > 8]
    assert crossing and all(r.reason.startswith(("tensor across hosts", "not divisible"))
                            for r in crossing)
    if batch == 512 and zero is None:   # docs/planner.md's step times: 89.5 against 90.4 s
        assert (round(rec.estimate.step_time_s, 1), round(step[8], 1)) == (89.5, 90.4), step
    if batch == 128:        # docs/planner.md's TFLOP/s of t=8 and t=16 at d = 1
        tflops = {t: best(rows, tensor=t, pipe=64 // t, data=1).estimate.tflops_per_gpu
                  for t in (8, 16)}
        assert tflops == {8: pytest.approx(174, abs=1), 16: pytest.approx(156, abs=1)}


def test_5_9b_pipeline_vs_data_parallel_at_batch_512():
    cfg = config(None, **M59, train__global_batch_size=512)
    tput = {}
    for p in (2, 32):
        rows = plan(cfg, 64, A100, 8, fixed={"parallel.tensor": 1, "parallel.pipe": p})
        tput[p] = rows[0].estimate.tflops_per_gpu
    assert tput[2] > 1.4 * tput[32], tput        # the paper: (p=2, d=32) far ahead


def _gpt3_96(batch, schedule, v, sg):
    cfg = config("gpt3-175b", train__global_batch_size=batch)
    rows = plan(cfg, 96, A100, 8, fixed={
        "parallel.tensor": 8, "parallel.pipe": 12, "train.micro_batch_size": 1,
        "parallel.schedule": schedule, "parallel.virtual_stages": v,
        "parallel.scatter_gather": sg, "train.recompute": "full",
        "parallel.sequence_parallel": False})
    assert len(rows) == 1 and rows[0].ok
    return rows[0].estimate.step_time_s


def test_interleaved_ahead_at_small_batch_behind_without_scatter_gather_at_large():
    for batch in (12, 24, 48):
        assert _gpt3_96(batch, "interleaved", 2, True) < _gpt3_96(batch, "1f1b", 1, False)
    for batch in (768, 1536):
        assert _gpt3_96(batch, "interleaved", 2, False) > _gpt3_96(batch, "1f1b", 1, False)
        # scatter/gather is what keeps it level (the paper: up to 11%)
        assert _gpt3_96(batch, "interleaved", 2, True) < _gpt3_96(batch, "interleaved", 2, False)



def test_data_parallel_traffic_by_zero():
    """zero 1: the weights gathered and the gradients reduce-scattered once a step; zero 2: the
    gather once, a reduce-scatter per microbatch; zero 3: two gathers and a reduce-scatter per
    microbatch; a bfloat16 reduction halves zero 0's all-reduce; AdamW over 1/d of the state."""
    base = dict(parallel__data=4, parallel__pipe=1, parallel__tensor=1,
                train__global_batch_size=32, train__micro_batch_size=1)
    t = {z: plan_cost.dp_allreduce_seconds(config("gpt-7.5b", **base, parallel__zero=z), H100, 8)
         for z in (0, 1, 2, 3)}
    m = 8
    gather, scatter = t[1] / 3, 2 * t[1] / 3      # bf16 weights, f32 gradients: 1 : 2 bytes
    assert t[2] == pytest.approx(gather + m * scatter, rel=1e-3)
    assert t[3] == pytest.approx(m * (2 * gather + scatter), rel=1e-3)
    bf16 = plan_cost.dp_allreduce_seconds(config("gpt-7.5b", **base,
                                                 parallel__grad_reduce_dtype="bfloat16"), H100, 8)
    assert bf16 == pytest.approx(t[0] / 2, rel=1e-3)
    opt = {z: plan_cost.optimizer_seconds(config("gpt-7.5b", **base, parallel__zero=z), H100)
           for z in (0, 1)}
    assert opt[1] == pytest.approx(opt[0] / 4, rel=1e-2)


def test_xla_attention_only_in_a_layer_scan():
    """cuDNN's attention runs on (d, 1, t) meshes unless the layers are scanned (zero=3)."""
    base = dict(parallel__data=2, parallel__tensor=2, parallel__pipe=1)
    assert not plan_cost.uses_xla_attention(config("bench-1.3b", **base), H100)
    assert plan_cost.uses_xla_attention(config("bench-1.3b", **base, parallel__zero=3), H100)
    assert plan_cost.uses_xla_attention(config("bench-1.3b", **base, tuning__scan_layers=True),
                                        H100)
    assert not plan_cost.uses_xla_attention(config("bench-1.3b", **base, parallel__zero=3), A100)


# ----------------------------------------------------------------------------- players

@pytest.mark.parametrize("name,p,m,v", [("1f1b", 4, 16, 1), ("interleaved", 4, 16, 2),
                                        ("gpipe", 3, 7, 1)])
def test_lockstep_player_matches_schedule_cost_model(name, p, m, v):
    """With no overheads and t_b = 2 t_f the played table is Schedule.predicted_time."""
    n = 2
    counts = (n,) * (p * v)
    units = {"head": 0.0, "embed": 0.0, "bwd": 2.0}
    seconds, ticks = play.lockstep_seconds(name, p, m, v, True, counts, units, 1.0, 0.0)
    sched = build_schedule(name, p, m, v)
    assert seconds == pytest.approx(sched.predicted_time(t_f=n * v, t_b=2 * n * v))
    assert ticks == sched.num_ticks


def test_async_player_closed_form_and_extrapolation(monkeypatch):
    p, m, tf, tb = 4, 64, 1.0, 2.0
    op_s = {(k, c): (tf if k == "F" else tb) for k in "FB" for c in range(p)}
    seconds, _ = play.async_seconds("1f1b", p, m, 1, op_s, 0.0)
    assert seconds == pytest.approx((m + p - 1) * (tf + tb))
    # big tables are extrapolated from m = 3p and 4p: the same as playing them whole
    args = [("1f1b", 8, 200, 1, (3,) * 8), ("interleaved", 8, 96, 3, (2,) * 24)]
    units = {"head": 0.3, "embed": 0.05, "bwd": 2.6}
    for name, pp, mm, v, counts in args:
        costs = {(k, c): 1.0 + 0.1 * c + (k == "B") for k in "FB" for c in range(pp * v)}
        monkeypatch.setattr(play, "EXACT_MAX_OPS", 10 ** 9)
        whole = (play.lockstep_seconds(name, pp, mm, v, True, counts, units, 1.0, 0.4),
                 play.async_seconds(name, pp, mm, v, costs, 0.2))
        monkeypatch.setattr(play, "EXACT_MAX_OPS", 0)
        extra = (play.lockstep_seconds(name, pp, mm, v, True, counts, units, 1.0, 0.4),
                 play.async_seconds(name, pp, mm, v, costs, 0.2))
        assert extra[0][0] == pytest.approx(whole[0][0])
        assert extra[1][0] == pytest.approx(whole[1][0])


def test_async_player_zero_bubble():
    """Zero-bubble tables played asynchronously (Megatron-style GPUs, e.g. --gpu a100): W
    after its B, no message; with t_F = t_B = t_W (a whole backward 2 t_F) the step is between
    the paper's 3m units and 1F1B's 3(m + p - 1), ZB-V (half-size chunks) the closest to 3m."""
    p, m = 4, 16
    fb = {(k, c): 1.0 for k in "FBW" for c in range(p)}
    one_f_one_b, _ = play.async_seconds("1f1b", p, m, 1, {**fb, **{("B", c): 2.0
                                                                  for c in range(p)}}, 0.0)
    h1, ops = play.async_seconds("zb-h1", p, m, 1, fb, 0.0)
    v, _ = play.async_seconds("zb-v", p, m, 2, {(k, c): 0.5 for k in "FBW"
                                                for c in range(2 * p)}, 0.0)
    assert one_f_one_b == pytest.approx(3 * (m + p - 1)) and ops == 3 * m * p
    assert 3 * m <= v < h1 < one_f_one_b
    assert h1 <= 3 * m + p + 2 and v <= 3 * m + p


def test_plan_prices_zero_bubble_layouts_on_async_gpus(capsys):
    """ptdp-plan with a zero-bubble schedule on an async GPU kind: a table, no crash."""
    assert plan_main(["--gpus", "8", "--gpu", "a100", "parallel.schedule=zb-h1",
                      "model.num_layers=8"]) == 0
    assert "zb-h1" in capsys.readouterr().out


# ----------------------------------------------------------------------------- CLI, auto, bad input

def test_cli_json_recommended_first(capsys):
    assert plan_main(["configs/bench-1.3b.yaml", "--gpus", "4", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    keys = {"data", "pipe", "tensor", "micro_batch_size", "schedule", "virtual_stages",
            "recompute", "fits", "reason", "memory_per_device_gib", "bubble", "step_time_s",
            "tflops_per_gpu", "days"}
    assert keys <= set(rows[0]) and rows[0]["reason"] == "" and rows[0]["fits"]
    valid = [r for r in rows if not r["reason"]]
    assert [r["step_time_s"] for r in valid] == sorted(r["step_time_s"] for r in valid)
    assert any(r["reason"].startswith("not divisible") for r in rows)
    assert all(r["data"] * r["pipe"] * r["context"] * r["tensor"] == 4 for r in rows)
    assert any(r["context"] > 1 for r in rows)                 # context parallelism searched


def test_cli_table_and_pinned_keys(capsys):
    argv = ["configs/bench-1.3b.yaml", "--gpus", "4", "--gpu", "h200", "parallel.data=1",
            "train.recompute=selective", "hw.ib_bytes_per_s=2.5e10"]
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    assert "| 1 | 1 |" in out and "recommended" in out and "valid layouts of" in out


@pytest.mark.parametrize("argv,words", [
    (["--gpus", "0"], ["--gpus", "0"]),
    (["--gpus", "4", "--batch", "10", "train.micro_batch_size=4"],
     ["train.global_batch_size=10", "train.micro_batch_size=4"]),
    (["--gpus", "4", "--gpu", "tpu"], ["tpu"]),
    (["--gpus", "4", "hw.warp_speed=9"], ["hw.warp_speed"]),
    (["--gpus", "4", "model.hidden_size=100", "model.num_heads=3"],
     ["model.hidden_size=100", "model.num_heads=3"]),
    (["--gpus", "4", "--batch", "0"], ["train.global_batch_size", "0"]),
    (["--gpus", "4", "--top", "-3"], ["--top must be a positive number", "got -3"]),
    (["--gpus", "4", "--top", "0"], ["--top must be a positive number", "got 0"]),
    (["--gpus", "4", "--tokens", "-1"], ["--tokens must be a positive number", "got -1"]),
    (["--gpus", "4", "--tokens", "nan"], ["--tokens must be a positive number", "got nan"]),
])
def test_bad_input_is_a_clear_error(argv, words, capsys):
    assert plan_main(["configs/bench-1.3b.yaml"] + argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("ptdp-plan: config error:") and all(w in err for w in words), err
    assert err.count("\n") == 1, err


PINNED = ["parallel.data=1", "parallel.pipe=8", "parallel.tensor=1",
                 "train.micro_batch_size=1", "train.recompute=full", "parallel.schedule=1f1b"]


@pytest.mark.parametrize("name,words", [
    ("llama3-8b", ["8.03B parameters;"]),               # GPT's formula said 7.00B
    ("gpt-145.6b", ["145.62B parameters;"]),            # the paper's count, equal here
])
def test_the_header_counts_the_models_parameters(name, words, capsys):
    assert plan_main([f"configs/{name}.yaml", "--gpus", "8", *PINNED]) in (0, 2)
    head = capsys.readouterr().out.splitlines()[0]
    assert all(w in head for w in words) and "(paper's formula)" not in head, head


def test_a_layout_just_over_the_limit_shows_the_gap():
    """128.64 GiB against 128.6: not '128.6 GiB > 128.6 GiB'."""
    assert over(128.64 * GiB, 128.6 * GiB) == "128.64 GiB > 128.60 GiB"
    assert over(76.31 * GiB, 76.0 * GiB) == "76.3 GiB > 76.0 GiB"
    assert over(1.00001 * GiB, GiB) == "1.0000 GiB > 1.0000 GiB"       # at most 4 decimals


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_no_valid_layout_is_a_user_error(json_flag, capsys):
    """Every layout rejected: the rejected rows still printed, then one line and exit 2."""
    argv = ["configs/tiny-gpt.yaml", "--gpus", "3", "--batch", "7", *json_flag]
    assert plan_main(argv) == ExitCode.CONFIG
    out, err = capsys.readouterr()
    assert "not divisible: global batch 7 by d=3" in out
    assert err.count("\n") == 1 and err.startswith("ptdp-plan: config error: no valid layout")
    assert all(w in err for w in ("--gpus 3", "--batch 7", "all 13 rejected")), err


def test_choose_layout_is_valid_and_explicit_keys_win():
    cfg = config("demo")
    choice = choose_layout(cfg, 8, 8)
    validate(load_config(cfg, choice), 8)
    pinned = choose_layout(cfg, 8, 8, gpu="h100", fixed={"parallel.pipe": 2,
                                                         "train.recompute": "selective"})
    assert pinned["parallel.pipe"] == 2 and pinned["train.recompute"] == "selective"
    validate(load_config(cfg, pinned), 8)
    with pytest.raises(ConfigError, match="the planner: no layout of model.num_layers=128"):
        choose_layout(config("gpt-1t"), 8, 8, gpu="h100")


def test_hw_overrides():
    slow = with_overrides(A100, {"ib_bytes_per_s": "2.5e9"})
    cfg = config("gpt-145.6b")
    assert estimate_step(cfg, slow, 8).step_time_s > estimate_step(cfg, A100, 8).step_time_s
    with pytest.raises(ValueError, match="not a GPU kind field"):
        with_overrides(A100, {"gemm_efficiency": 1})


def test_plan_searches_zero_where_data_parallel():
    """parallel.zero is searched where d > 1: 0-3 without pipelining, 0 and 1 with it (2 and 3
    gather a stage's weights once a step, as 1); at d = 1 only 0. On 4x H200 the 7.5B GPT's
    recommendation is (4,1,1) zero 2, micro 8: the fastest layout measured (1.43 s with a
    bfloat16 reduction, against 1.74 s for (1,1,4) SP and 1.56 s for (1,4,1) phased, 4x H200,
    2026-11-26/27), and its overrides carry the zero value."""
    rows = [r for r in plan(config("gpt-7.5b", train__global_batch_size=32), 4, "h200", 8)
            if r.ok]
    zeros = {}
    for r in rows:
        zeros.setdefault((r.data, r.pipe), set()).add(r.zero)
    assert zeros[(1, 4)] == {0} and zeros[(2, 2)] == {0, 1} and zeros[(4, 1)] == {0, 1, 2, 3}
    rec = rows[0]
    assert (rec.data, rec.pipe, rec.tensor, rec.zero, rec.micro_batch_size) == (4, 1, 1, 2, 8)
    assert rec.overrides()["parallel.zero"] == 2 and rec.to_json()["zero"] == 2
    pinned = plan(config("gpt-7.5b", train__global_batch_size=32), 4, "h200", 8,
                  fixed={"parallel.zero": 0})
    assert {r.zero for r in pinned} == {0}


def test_zero_1_accumulation_passes():
    """Without pipelining, zero 0 and 1 add every microbatch's gradients into full-size float32
    sums: m - 1 passes, none at m = 1, none for zero 2 (shard-sized sums)."""
    base = dict(train__global_batch_size=32, parallel__data=4, parallel__tensor=1)
    acc = lambda **kw: plan_cost.accumulate_seconds(config("gpt-7.5b", **base, **kw), H100)
    assert acc(parallel__zero=1, train__micro_batch_size=8) == 0.0
    assert acc(parallel__zero=2, train__micro_batch_size=1) == 0.0
    one, two = acc(parallel__zero=1, train__micro_batch_size=1), acc(
        parallel__zero=1, train__micro_batch_size=2)
    assert one == pytest.approx(7 / 3 * two) and one > 0.1          # 7 passes against 3


def test_phased_interleaving_searched_on_our_gpus_only():
    """1f1b-phased and zb-phased with v = 2..4 are searched for our executor's GPU kinds (with
    m % p == 0 or a reason) and priced where pinned; not for the paper's A100 model."""
    cfg = config("bench-1.3b", train__micro_batch_size=1)
    rows = plan(cfg, 4, "h200", 8, fixed={"parallel.pipe": 4, "parallel.data": 1,
                                           "parallel.schedule": "1f1b-phased",
                                           "parallel.virtual_stages": 2})
    assert rows[0].ok and rows[0].virtual_stages == 2 and rows[0].schedule == "1f1b-phased"
    v1 = estimate_step(config("bench-1.3b", train__micro_batch_size=1, parallel__pipe=4,
                              parallel__schedule="1f1b-phased"), gpu_kind("h200"), 8)
    assert rows[0].estimate.step_time_s < v1.step_time_s       # the bubble halves
    searched = plan(cfg, 4, "h200", 8, fixed={"parallel.pipe": 4, "parallel.data": 1})
    found = {(r.schedule, r.virtual_stages) for r in searched if r.ok}
    assert {("1f1b-phased", 2), ("zb-phased", 2), ("1f1b-phased", 3)} <= found
    # 24 layers on 4 stages: v = 2, 3 split evenly (v 4 would need 16 | 24); 6 > PHASED_MAX_V
    assert {v for s, v in found if s.endswith("phased")} == {1, 2, 3}
    paper = plan(cfg, 4, A100, 8, fixed={"parallel.pipe": 4, "parallel.data": 1})
    assert not any(r.schedule == "1f1b-phased" and r.virtual_stages > 1 for r in paper)
    odd = plan(config("bench-1.3b", train__global_batch_size=12), 4, "h200", 8,
               fixed={"parallel.pipe": 4, "parallel.data": 1, "train.micro_batch_size": 2,
                      "parallel.schedule": "1f1b-phased", "parallel.virtual_stages": 2})
    assert not odd[0].ok and "m % p == 0" in odd[0].reason


def test_tensor_layouts_price_sequence_parallelism():
    """Sequence parallelism is searched where t > 1 divides the sequence: the 1.3B with
    --mesh 1,1,2 on H200 gets it, micro 16, no recomputation (0.2846 s; without it the
    planner's pick ran 0.3096 s, 4x H200, 2026-11-28); pinned off, it stays off."""
    from ptdp_jax.plan.search import best_layout
    cfg = load_config("configs/bench-1.3b.yaml")
    mesh = {"parallel.data": 1, "parallel.pipe": 1, "parallel.tensor": 2}
    best = best_layout(cfg, 2, 2, "h200", fixed=mesh)
    assert (best.sequence_parallel, best.micro_batch_size, best.recompute) == (True, 16, "none")
    assert best.overrides()["parallel.sequence_parallel"] is True
    off = best_layout(cfg, 2, 2, "h200", fixed={**mesh, "parallel.sequence_parallel": False})
    assert not off.sequence_parallel
    assert off.estimate.step_time_s > best.estimate.step_time_s
    one = best_layout(cfg, 1, 1, "h200")
    assert not one.sequence_parallel                      # a no-op at t = 1: never searched


def test_h200_limit_is_the_one_training_runs_under():
    """--gpu h200 fits a layout under JAX's own limit on an H200 at a 0.92 fraction (128.617
    GiB, 2x H200, 2026-11-29), so it recommends the layout training ran there for LLaMA-3-8B
    with FP8: (1,2,1) zb-phased v 2, not (2,1,1) zero 2 keeping the MLP's activation (128.8
    GiB, over that limit: a layout nvidia-smi's figure would take)."""
    from ptdp_jax.plan.search import best_layout
    kind = gpu_kind("h200")
    assert kind.memory_bytes * kind.usable_memory_fraction / 2 ** 30 == pytest.approx(128.617, abs=1e-3)
    cfg = load_config("configs/llama3-8b.yaml", overrides={
        "model.seq_len": 4096, "train.global_batch_size": 16, "train.fp8": True})
    best = best_layout(cfg, 2, 8, "h200")
    assert (best.data, best.pipe, best.tensor, best.schedule, best.virtual_stages) == \
        (1, 2, 1, "zb-phased", 2)
    # (2,1,1) zero 2, micro 2, keeping the MLP's activation (128.8 GiB): a valid layout under
    # nvidia-smi's figure, not under CUDA's limit (there the search keeps it without)
    def zero2_keeping(k):
        return [c for c in plan(cfg, 2, k, 8) if c.ok and c.recompute == "selective" and
                (c.data, c.zero, c.micro_batch_size, c.keep_ffn_activation) == (2, 2, 2, "auto")]
    assert zero2_keeping(kind) == []
    assert len(zero2_keeping(with_overrides(kind, {"memory_bytes": 143771 * 2 ** 20}))) == 1


def test_llama3_8b_at_128k_on_8_h200s(capsys):
    """Valid layouts, context parallelism among them (a `c` column), the recommended first."""
    assert plan_main(["configs/llama3-8b.yaml", "--gpus", "8", "--gpu", "h200",
                      "model.seq_len=131072", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["fits"] and rows[0]["reason"] == ""
    assert any(r["context"] > 1 and r["fits"] and not r["reason"] for r in rows)


def test_context_parallelism_where_nothing_else_fits():
    cfg = load_config("configs/llama3-8b.yaml", {"model.seq_len": 2 ** 21, "model.num_layers": 1,
                                                 "train.global_batch_size": 1})
    rows = plan(cfg, 16, "h200")
    assert rows[0].ok and rows[0].context > 1, rows[0]
    assert not any(r.ok for r in rows if r.context == 1)
    assert rows[0].overrides()["parallel.context"] == rows[0].context


def test_context_attention_priced_at_its_share_of_the_whole():
    """A context rank's attention (cuDNN parts) costs CONTEXT_PARTS_SLOWDOWN times 1/c of the
    whole sequence's flash attention; document masking in cuDNN's packed layout as much as
    the whole (an upper bound), in the tiled kernel (no packed layout) TILED_SLOWDOWN times
    it; split by tensor as before."""
    from dataclasses import replace
    from ptdp_jax.plan import cost as K
    gpu = gpu_kind("h200")
    at = lambda **o: K.attention_seconds(load_config("configs/llama3-8b.yaml", {
        "model.seq_len": 65536, "train.micro_batch_size": 1, **o}), gpu)
    whole = at()
    for c in (2, 4):
        got = at(**{"parallel.context": c})
        for a, b in zip(got, whole):
            assert a == pytest.approx(b / c * K.CONTEXT_PARTS_SLOWDOWN)
    assert at(**{"data.document_mask": True}) == pytest.approx(whole)
    gpu = replace(gpu, packed_attention=False)
    for a, b in zip(at(**{"data.document_mask": True}), whole):
        assert a == pytest.approx(b * K.TILED_SLOWDOWN)
