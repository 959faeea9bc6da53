"""tuning.tp_comm_overlap (models/tp_overlap.py): sequence parallelism's all-gathers and
reduce-scatters decomposed into rings of permutes around the GEMMs. The same loss and gradients
as the one-device model (rows and sequence splits, both models, each recompute mode, with data
parallelism and dropout); the layers' all-gathers become permutes; bad combinations refused
before any compile."""
import re
from collections import Counter

import pytest

from compiled import compile_grad_fn
from parity import assert_close, loss_and_grads, reference, tiny_config

OV = {"parallel.sequence_parallel": True, "tuning.tp_comm_overlap": True}

CASES = [
    ("gpt", (1, 1, 2), {"train.micro_batch_size": 2, "model.dropout": 0.1}),    # rows
    ("gpt", (1, 1, 4), {"train.recompute": "selective"}),                        # sequence
    ("llama", (2, 1, 2), {"train.micro_batch_size": 2, "train.recompute": "full"}),
    ("llama", (1, 1, 4), {"train.micro_batch_size": 4}),
    ("gpt", (1, 1, 8), {"train.micro_batch_size": 2}),     # direct: 7 sends of each block at once
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{'x'.join(map(str, c[1]))}-"
                         f"mb{c[2].get('train.micro_batch_size', 1)}-"
                         f"{c[2].get('train.recompute', 'none')}")
def test_parity(case):
    arch, mesh, o = case
    ref = reference(arch, tuple((k, v) for k, v in o.items() if k == "model.dropout"))
    assert_close(loss_and_grads(tiny_config(arch, mesh, **o, **OV)), ref)


def test_direct_sends_no_chain():
    """Each block goes straight to every rank: t - 1 permutes a ring, none of them reading
    another permute's output (a ring of hops would pass on the block received before)."""
    o = {"parallel.sequence_parallel": True, "train.micro_batch_size": 4, "model.num_layers": 2,
         "tuning.tp_comm_overlap": True}
    text = compile_grad_fn(tiny_config("gpt", (1, 1, 4), **o)).as_text()
    count = len(re.findall(r"= \S+ collective-permute(?:-start)?\(", text))
    chained = len(re.findall(
        r"collective-permute(?:-start)?\([^)]*%(?:ppermute|collective-permute)", text))
    assert count > 0 and chained == 0, (count, chained)


def _collectives(cfg) -> Counter:
    text = compile_grad_fn(cfg).as_text()
    return Counter(re.findall(r"= \S+ (all-gather|reduce-scatter|all-reduce|collective-permute)"
                              r"(?:-start)?\(", text))


def test_layer_gathers_become_permutes():
    """Without the overlap a GPT layer all-gathers 6 times (Megatron's count, see
    test_sequence_parallel); with it none: its 4 forward rings alone send t - 1 blocks each."""
    L, t = 2, 4
    o = {"parallel.sequence_parallel": True, "train.micro_batch_size": 4, "model.num_layers": L}
    plain = _collectives(tiny_config("gpt", (1, 1, t), **o))
    over = _collectives(tiny_config("gpt", (1, 1, t), **o, **{"tuning.tp_comm_overlap": True}))
    assert plain["collective-permute"] == 0
    assert plain["all-gather"] - over["all-gather"] >= 6 * L, (plain, over)
    assert over["collective-permute"] >= 4 * (t - 1) * L, over


@pytest.mark.parametrize("extra, words", [
    ({"parallel.sequence_parallel": False}, "parallel.sequence_parallel=true"),
    ({"parallel.tensor": 1, "parallel.data": 2}, "parallel.tensor > 1"),
    ({"parallel.pipe": 2}, "parallel.pipe=2"),
    ({"tuning.scan_layers": True}, "tuning.scan_layers=True"),
    ({"parallel.zero": 3, "parallel.data": 2}, "parallel.zero=3"),
])
def test_refused_before_compile(extra, words):
    from ptdp_jax.config.load import ConfigError
    mesh = (extra.pop("parallel.data", 1), extra.pop("parallel.pipe", 1),
            extra.pop("parallel.tensor", 2))
    with pytest.raises(ConfigError) as e:
        tiny_config("gpt", mesh, **{**OV, **extra})
    assert "tuning.tp_comm_overlap" in str(e.value) and words in str(e.value), str(e.value)


def test_evaluation_keeps_gspmd_collectives_and_the_loss():
    """Evaluation scans its layers, where the overlap steps aside (layers._overlap): the same
    loss as without the flag."""
    import jax

    from parity import batch_for
    from ptdp_jax.training import state as S
    from ptdp_jax.training.evaluate import make_eval_fn
    from ptdp_jax.parallel.sharding import make_mesh

    def loss(cfg):
        mesh, tx = make_mesh(cfg.parallel.mesh_dims), S.make_optimizer(cfg)[0]
        params = jax.jit(lambda: S.init_state(cfg, tx)["params"])()
        return float(jax.jit(make_eval_fn(cfg, mesh))(params, batch_for(cfg)))
    o = {"parallel.sequence_parallel": True, "train.micro_batch_size": 2}
    assert loss(tiny_config("gpt", (1, 1, 2), **o, **{"tuning.tp_comm_overlap": True})) == \
        pytest.approx(loss(tiny_config("gpt", (1, 1, 2), **o)), rel=1e-6)


@pytest.mark.parametrize("n", [2, 4])
def test_one_index_program_per_block(n):
    """sharding.rank_plus, the rings' block index: (r + k) mod n on every rank, and one jaxpr
    for every k of one residue mod n (the gather ring's (r - i) and the scatter ring's
    (r + i + 1) written two ways make XLA slice each block twice)."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P
    from ptdp_jax.parallel.sharding import rank_plus

    mesh = jax.make_mesh((n,), ("tensor",), devices=jax.devices()[:n],
                         axis_types=(jax.sharding.AxisType.Auto,))

    def at(k):
        return jax.shard_map(lambda x: x * 0 + rank_plus("tensor", k), mesh=mesh,
                             in_specs=P("tensor"), out_specs=P("tensor"))

    x = np.zeros(n, np.int32)
    for k in range(-2 * n, 2 * n + 1):
        assert list(jax.jit(at(k))(x)) == [(r + k) % n for r in range(n)], k
        assert str(jax.make_jaxpr(at(k))(x)) == str(jax.make_jaxpr(at(k % n))(x)), k
    assert "rem" not in str(jax.make_jaxpr(at(n))(x))      # k = 0 mod n: the rank itself
