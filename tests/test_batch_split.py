"""parallel.batch_split (models.model.run_layers): each microbatch's rows in k chunks that go
through every layer side by side, so one chunk's tensor-parallel collectives can run beside
another's GEMMs. The same loss and gradients as the one-device model (sequence parallelism by
rows and by sequence, ZeRO, dropout, recomputation); each layer's collectives once per chunk,
on a chunk's rows; bad values refused before any compile."""
import jax.numpy as jnp
import numpy as np
import pytest

from parity import assert_close, loss_and_grads, reference, tiny_config
from test_sequence_parallel import layer_collectives

from ptdp_jax.models.model import merge_rows, split_rows
from ptdp_jax.sharding import sequence_parallel_rows

SP = {"parallel.sequence_parallel": True}
CASES = [   # (arch, mesh, overrides): rows split over 'tensor' per chunk; by sequence; d x t
    ("gpt", (1, 1, 4), {**SP, "train.micro_batch_size": 8, "parallel.batch_split": 2,
                        "model.dropout": 0.1}),
    ("llama", (1, 1, 4), {**SP, "train.micro_batch_size": 2, "parallel.batch_split": 2,
                          "train.recompute": "selective"}),
    ("gpt", (2, 1, 2), {**SP, "train.micro_batch_size": 4, "parallel.batch_split": 2,
                        "parallel.zero": 2}),
    ("llama", (2, 1, 2), {"train.micro_batch_size": 4, "parallel.batch_split": 4,
                          "parallel.zero": 3, "train.recompute": "full"}),
]


def _id(case):
    arch, mesh, o = case
    return "-".join([arch, "x".join(map(str, mesh)), f"k{o['parallel.batch_split']}",
                     "sp" if o.get("parallel.sequence_parallel") else "",
                     f"zero{o.get('parallel.zero', 0)}"])


@pytest.mark.parametrize("case", CASES, ids=[_id(c) for c in CASES])
def test_batch_split_parity(case):
    arch, mesh, overrides = case
    ref = reference(arch, tuple((k, v) for k, v in overrides.items() if k == "model.dropout"))
    assert_close(loss_and_grads(tiny_config(arch, mesh, **overrides)), ref)


def test_split_rows_takes_every_kth_row_and_merge_inverts_it():
    x = jnp.arange(12 * 3).reshape(12, 3)
    chunks = split_rows(x, 3)
    assert [c.shape for c in chunks] == [(4, 3)] * 3
    np.testing.assert_array_equal(chunks[1], x[1::3])
    np.testing.assert_array_equal(merge_rows(chunks), x)


@pytest.mark.parametrize("micro,dim", [(16, 0), (4, 1)])
def test_each_chunk_has_the_layers_collectives(micro, dim, tmp_path):
    """(1, 1, 8), sequence parallel, k = 2: the layer's 6 reduce-scatters and 6 all-gathers
    (test_sequence_parallel) once per chunk, each on the chunk's micro / 2 rows; split by
    rows where t divides a chunk's rows (micro 16: 8 rows), by sequence otherwise."""
    cfg = tiny_config("gpt", (1, 1, 8), **SP, **{"train.scan_layers": True,
                                                 "train.micro_batch_size": micro,
                                                 "train.global_batch_size": 16,
                                                 "parallel.batch_split": 2})
    assert sequence_parallel_rows(cfg) == (dim == 0)
    dims = []
    counts = layer_collectives(cfg, tmp_path, dims)
    assert counts == {"all-reduce": 0, "reduce-scatter": 12, "all-gather": 12}, counts
    assert dims == [dim] * 12, dims


@pytest.mark.parametrize("overrides,words", [
    ({"parallel.batch_split": 0}, ["parallel.batch_split", ">= 1", "0"]),
    ({"parallel.batch_split": 3, "train.micro_batch_size": 4},
     ["parallel.batch_split=3", "train.micro_batch_size=4"]),
    ({"parallel.batch_split": 2, "train.micro_batch_size": 2, "parallel.pipe": 2},
     ["parallel.batch_split=2", "parallel.pipe=2"]),
])
def test_bad_batch_split_is_refused(overrides, words):
    with pytest.raises(ValueError) as e:
        tiny_config("gpt", (1, overrides.get("parallel.pipe", 1), 1), **overrides)
    assert all(w in str(e.value) for w in words), str(e.value)
