"""Sequence parallelism (parallel.sequence_parallel; Korthikanti et al. 2022): the same loss
and gradients as the one-device model on every kind of mesh, both models, every recompute
mode; the layer's (b, s, h) all-reduces become reduce-scatters and all-gathers; the
activations kept for the backward shrink; the stage-to-stage message is split over 'tensor'
without scatter/gather; the rule table and the memory estimate say so."""
import re
from pathlib import Path

import pytest

from compiled import compile_grad_fn, partitioned_hlo
from parity import assert_close, loss_and_grads, reference, tiny_config
from test_hlo import _permute_payloads, _shapes

ROOT = Path(__file__).resolve().parents[1]
SP = {"parallel.sequence_parallel": True}
F1 = {"parallel.schedule": "1f1b"}
I2 = {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}

# Meshes of 8 devices with t > 1, both models, each recompute mode; dropout (split by sequence
# too) and scatter/gather on top once each.
CASES = [
    ("gpt", (1, 1, 8), {"model.dropout": 0.1}),
    ("llama", (1, 1, 8), {"train.recompute": "full"}),
    ("llama", (2, 1, 4), {"train.recompute": "selective"}),
    ("gpt", (1, 2, 4), {**F1, "train.micro_batch_size": 2, "train.recompute": "full",
                        "parallel.scatter_gather": True}),
    ("llama", (2, 2, 2), {**I2, "train.micro_batch_size": 2}),
    ("gpt", (2, 2, 2), {**I2, "train.micro_batch_size": 2, "train.recompute": "selective"}),
    ("gpt", (1, 2, 4), {"parallel.schedule": "zb-v", "parallel.virtual_stages": 2,
                        "train.micro_batch_size": 2, "model.dropout": 0.1}),
    # t divides the microbatch: split by rows (sharding.sequence_parallel_rows); the two
    # (2, 2, 2) cases above (micro 2) take this route too
    ("gpt", (1, 1, 8), {"train.micro_batch_size": 8, "model.dropout": 0.1}),
    ("llama", (1, 2, 4), {**F1, "train.micro_batch_size": 4, "train.recompute": "full"}),
]


def _id(case):
    arch, mesh, o = case
    tags = [o.get("parallel.schedule", ""), o.get("train.recompute", "none"),
            "sg" if o.get("parallel.scatter_gather") else "",
            "dropout" if o.get("model.dropout") else ""]
    return "-".join([arch, "x".join(map(str, mesh))] + [t for t in tags if t])


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_sequence_parallel_parity(case):
    arch, mesh, overrides = case
    ref = reference(arch, tuple((k, v) for k, v in overrides.items() if k == "model.dropout"))
    assert_close(loss_and_grads(tiny_config(arch, mesh, **overrides, **SP)), ref)


def test_evaluation_under_sequence_parallelism():
    """The forward-only ring of evaluate.py (p > 1) gives the one-device loss."""
    import jax

    from ptdp_jax.training import state as S
    from ptdp_jax.training.evaluate import make_eval_fn
    from ptdp_jax.parallel.sharding import make_mesh
    from parity import batch_for

    def loss(cfg):
        mesh, tx = make_mesh(cfg.parallel.mesh_dims), S.make_optimizer(cfg)[0]
        params = jax.jit(lambda: S.init_state(cfg, tx)["params"])()
        return float(jax.jit(make_eval_fn(cfg, mesh))(params, batch_for(cfg)))
    assert loss(tiny_config("llama", (1, 2, 4), **SP)) == pytest.approx(
        loss(tiny_config("llama", (1, 1, 1))), rel=2e-5)


# ----------------------------------------------------------------------------- HLO

def _instructions(hlo: str):
    """name -> (shape, opcode, line), and name -> names of its users."""
    defs, users = {}, {}
    for line in hlo.splitlines():
        m = re.match(r"\s*(?:ROOT )?%([\w.\-]+) = (\S+) ([\w\-]+)\((.*)", line)
        if not m:
            continue
        name, shape, op, rest = m.groups()
        defs[name] = (shape.split("{")[0], op, line)
        for operand in re.findall(r"%([\w.\-]+)", rest.split("metadata=")[0]):
            users.setdefault(operand, []).append(name)
    return defs, users


def _consumers(name, defs, users):
    """The ops that use name's value, looking through copies, bitcasts and reshapes."""
    out = []
    for u in users.get(name, []):
        shape, op, _ = defs[u]
        out += _consumers(u, defs, users) if op in ("copy", "bitcast", "reshape") else [(op, shape)]
    return out


def layer_collectives(cfg, dump_dir, gather_dims=None):
    """Counts of the (b, s, h) collectives over 'tensor' of one layer (forward and backward:
    the ops under two while loops, microbatches and layers) right after partitioning. A
    reduce-scatter is the partitioner's all-reduce whose one consumer is a dynamic-slice to
    (b, s/t, h), or (b/t, s, h) where the split is by rows (XLA's GPU pipeline fuses the two
    into a reduce-scatter, ReduceScatterCreator). gather_dims: a list that collects the
    dimension of each all-gather."""
    from ptdp_jax.parallel.sharding import sequence_parallel_rows
    b, s, h = cfg.train.micro_batch_size, cfg.model.seq_len, cfg.model.hidden_size
    t = cfg.parallel.tensor
    bsh = f"f32[{b},{s},{h}]"
    scattered = f"f32[{b // t},{s},{h}]" if sequence_parallel_rows(cfg) else f"f32[{b},{s // t},{h}]"
    defs, users = _instructions(partitioned_hlo(cfg, dump_dir))
    counts = {"all-reduce": 0, "reduce-scatter": 0, "all-gather": 0}
    for name, (shape, op, line) in defs.items():
        in_layer = len(re.findall(r"while/body", line)) >= 2
        if shape != bsh or not in_layer or op not in ("all-reduce", "all-gather"):
            continue
        if op == "all-reduce" and _consumers(name, defs, users) == [("dynamic-slice", scattered)]:
            op = "reduce-scatter"
        if op == "all-gather" and gather_dims is not None:
            gather_dims.append(int(re.search(r"dimensions=\{(\d+)\}", line).group(1)))
        counts[op] += 1
    return counts


@pytest.mark.parametrize("arch", ["gpt", "llama"])
def test_layer_all_reduces_become_reduce_scatter_and_all_gather(arch, tmp_path):
    """Megatron's layer: 2 all-reduces of (b, s, h) forward, and in the backward one per GEMM
    that reads a norm's output, summed after (GPT: q, k, v, fc1: 4; LLaMA: 5) in the
    partitioned program (XLA's all-reduce reassociation may sum them before reducing later in
    its pipeline). With sequence parallelism, as in
    Megatron, each becomes a reduce-scatter, and there are 6 all-gathers: 2 before the
    column-parallel GEMMs, 2 in the backward as the reduce-scatters' transposes, 2 in the
    backward again for the weight gradients (the gathered input is not kept)."""
    scan = {"tuning.scan_layers": True}        # one layer's ops: those under the layer scan
    plain = layer_collectives(tiny_config(arch, (1, 1, 8), **scan), tmp_path / "plain")
    sp = layer_collectives(tiny_config(arch, (1, 1, 8), **SP, **scan), tmp_path / "sp")
    assert plain == {"all-reduce": 6 if arch == "gpt" else 7, "reduce-scatter": 0,
                     "all-gather": 0}, plain
    assert sp == {"all-reduce": 0, "reduce-scatter": plain["all-reduce"], "all-gather": 6}, sp


@pytest.mark.parametrize("micro,dim", [(8, 0), (2, 1)])
def test_split_by_rows_where_t_divides_the_microbatch(micro, dim, tmp_path):
    """NCCL gathers along the major dim: with b > 1 a split of the sequence costs XLA a
    transpose around each collective on GPUs, so where t divides the microbatch's rows the
    activations are split by rows (every all-gather along dim 0); otherwise by sequence (dim
    1). Same collectives either way."""
    from ptdp_jax.parallel.sharding import sequence_parallel_rows
    cfg = tiny_config("gpt", (1, 1, 8), **SP, **{"tuning.scan_layers": True,
                                                 "train.micro_batch_size": micro})
    assert sequence_parallel_rows(cfg) == (dim == 0)
    dims = []
    counts = layer_collectives(cfg, tmp_path, dims)
    assert counts == {"all-reduce": 0, "reduce-scatter": 6, "all-gather": 6}, counts
    assert dims == [dim] * 6, dims


def test_cross_entropy_keeps_logits_vocab_sharded_under_sequence_parallelism():
    t = 8
    cfg = tiny_config("llama", (1, 1, t), **SP)
    shapes = _shapes(compile_grad_fn(cfg).as_text())
    b, s, vp = cfg.train.micro_batch_size, cfg.model.seq_len, cfg.model.padded_vocab_size
    assert f"{b},{s},{vp // t}" in shapes, "expected per-device logits of 1/t of the vocabulary"
    assert f"{b},{s},{vp}" not in shapes, "full (b, s, V) logits appear on one device"


def test_stage_message_is_split_without_scatter_gather():
    """The pipeline's message is a layer's output, already split by sequence over 'tensor':
    scatter/gather comes for free (1/t of (b, s, h) per send), and turning it on changes
    nothing."""
    t, o = 4, {**SP, "train.micro_batch_size": 4, "model.num_layers": 2}
    cfg = tiny_config("gpt", (1, 2, t), **o)
    sp = _permute_payloads(compile_grad_fn(cfg).as_text())
    both = _permute_payloads(compile_grad_fn(tiny_config(
        "gpt", (1, 2, t), **o, **{"parallel.scatter_gather": True})).as_text())
    b, s, h = 4, cfg.model.seq_len, cfg.model.hidden_size
    assert sp and max(sp) == b * s * h // t, sp
    assert sorted(both) == sorted(sp), (sp, both)


# ----------------------------------------------------------------------------- memory

MEM = {"model.seq_len": 64, "model.hidden_size": 64, "train.global_batch_size": 8,
       "train.micro_batch_size": 8}


@pytest.mark.parametrize("arch,recompute", [("gpt", "none"), ("llama", "selective")])
def test_activation_memory_drops_at_1x1x8(arch, recompute):
    """memory_analysis of the compiled step at (1, 1, 8): the temporaries (the activations
    kept for the backward, mostly) shrink by at least Korthikanti et al.'s replicated part,
    10 s b h bytes in 16-bit (5 (b, s, h) tensors per layer) times (1 - 1/t)."""
    t = 8
    # layers in a scan: what the backward keeps is then one stacked buffer per residual
    cfgs = [tiny_config(arch, (1, 1, t), **MEM, **{"train.recompute": recompute,
                                                   "tuning.scan_layers": True, **extra})
            for extra in ({}, SP)]
    plain, sp = (compile_grad_fn(c).memory_analysis().temp_size_in_bytes for c in cfgs)
    m = cfgs[0].model
    bsh_bytes = MEM["train.micro_batch_size"] * m.seq_len * m.hidden_size * 4   # float32
    floor = 5 * m.num_layers * bsh_bytes * (1 - 1 / t) if recompute == "none" else \
        2 * m.num_layers * bsh_bytes * (1 - 1 / t)     # selective keeps 3 (b, s, h) a layer
    assert plain - sp >= floor, (plain, sp, floor)
    assert sp < 0.6 * plain, (plain, sp)


def test_memory_estimate_counts_the_saving():
    from ptdp_jax.config.load import load_config
    from ptdp_jax.training.memory import estimate_memory, layer_activation_bytes_per_token

    def cfg(t, sp, recompute="selective", pipe=4):     # XLA's attention: no flash output kept
        return load_config(ROOT / "configs/bench-1.3b.yaml", {     # (head-split, not by sequence)
            "parallel.tensor": t, "parallel.pipe": pipe, "train.recompute": recompute,
            "train.micro_batch_size": 1, "parallel.sequence_parallel": sp,
            "tuning.attention": "xla"})
    for mode in ("none", "selective", "full"):
        one = layer_activation_bytes_per_token(cfg(1, False, mode))
        assert layer_activation_bytes_per_token(cfg(4, True, mode)) == pytest.approx(one / 4)
        assert layer_activation_bytes_per_token(cfg(1, True, mode)) == one     # t = 1: no-op
        assert layer_activation_bytes_per_token(cfg(4, False, mode)) > one / 4
    plain, sp = estimate_memory(cfg(2, False)), estimate_memory(cfg(2, True))
    assert sp.activations < plain.activations and sp.params == plain.params


# ----------------------------------------------------------------------------- rules, config

def test_rule_table_under_sequence_parallelism():
    from jax.sharding import PartitionSpec as P

    from ptdp_jax.models.layers import ACT, ACT_FULL, HEADS
    from ptdp_jax.pipeline.executor import MSG, MSG_SCATTERED
    from ptdp_jax.parallel.sharding import logical_to_spec, sequence_parallel_on

    assert logical_to_spec(ACT) == P("data", None, None)
    assert logical_to_spec(ACT, sequence_parallel=True) == P("data", "tensor", None)
    rows = logical_to_spec(ACT, sequence_parallel=True, rows=True)
    assert rows == P(("data", "tensor"), None, None)
    assert logical_to_spec(ACT, frozenset({"data", "pipe"}), True, True) == P("tensor", None, None)
    assert logical_to_spec(MSG, sequence_parallel=True, rows=True) == rows
    for names in (ACT_FULL, HEADS):             # attention and GEMM inputs: the whole sequence
        assert logical_to_spec(names, sequence_parallel=True) == logical_to_spec(names)
    assert logical_to_spec(MSG_SCATTERED) == P("data", None, "tensor")
    # under sequence parallelism the message is split by sequence, scatter/gather adds nothing
    assert logical_to_spec(MSG_SCATTERED, sequence_parallel=True) == \
        logical_to_spec(MSG, sequence_parallel=True) == P("data", "tensor", None)
    assert not sequence_parallel_on(tiny_config("gpt", (8, 1, 1), **SP).parallel)   # t = 1
    assert sequence_parallel_on(tiny_config("gpt", (1, 1, 8), **SP).parallel)


def test_validation_names_seq_len_and_t():
    from ptdp_jax.config.load import ConfigError
    with pytest.raises(ConfigError) as e:
        tiny_config("gpt", (1, 1, 8), **SP, **{"model.seq_len": 12})
    assert "model.seq_len=12" in str(e.value) and "parallel.tensor=8" in str(e.value)
    tiny_config("gpt", (8, 1, 1), **SP, **{"model.seq_len": 12})   # t = 1: nothing to split


def test_planner_keeps_sequence_parallelism_and_its_divisibility():
    from ptdp_jax.config.load import load_config
    from ptdp_jax.plan import plan
    cfg = load_config(ROOT / "configs/demo.yaml", {"model.seq_len": 6, **SP})   # 4 heads
    pin = {"parallel.sequence_parallel": True}          # searched unless pinned
    rows = plan(cfg, 8, "h100", fixed=pin)
    assert all("model.seq_len=6 by t=4" in r.reason for r in rows if r.tensor == 4)
    def key(r):
        return (r.data, r.pipe, r.micro_batch_size, r.schedule, r.virtual_stages, r.recompute,
                r.scatter_gather)
    off = load_config(cfg, {"parallel.sequence_parallel": False})
    plain = {key(r): r.memory for r in plan(off, 8, "h100", fixed={
        "parallel.sequence_parallel": False}) if r.tensor == 2 and r.memory}
    sp = [r for r in rows if r.tensor == 2 and r.memory]
    assert sp and all(r.memory.activations < plain[key(r)].activations for r in sp)
