"""tuning.tp_comm_overlap=auto: the ring of models/tp_overlap.py, with XLA's peer-mode
permutes (copy-engine copies between the GPUs of one process), where it was measured faster:
sequence parallelism over tensor > 1, no pipelining, layers unrolled, one microbatch a step, on
GPUs whose tensor groups each live in one process. Off on CPU and across processes (there XLA
falls back to NCCL's permutes, which made the ring slower)."""
from types import SimpleNamespace

import numpy as np
import pytest

from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.parallel.sharding import Sharder, tp_overlap_on
from ptdp_jax.config.decisions import PERMUTE_PEER_MODE
from ptdp_jax.training.step import compiler_options
from ptdp_jax.config.validation import validate

SP4 = {"parallel.sequence_parallel": True, "parallel.tensor": 4,
       "train.global_batch_size": 16, "train.micro_batch_size": 16}     # m = 1


def cfg(**ov):
    return load_config(overrides={**SP4, **ov})


def fake_mesh(shape, platform="gpu", processes=None):
    """What tp_overlap_on and compiler_options read of a mesh: its (data, pipe, tensor) array
    of devices, each with a platform and a process index (default: all in process 0)."""
    n = int(np.prod(shape))
    procs = processes if processes is not None else [0] * n
    devs = [SimpleNamespace(platform=platform, process_index=p) for p in procs]
    return SimpleNamespace(devices=np.array(devs, dtype=object).reshape(shape))


@pytest.mark.parametrize("ov, on", [
    ({}, True),
    ({"train.global_batch_size": 32}, False),                       # m = 2
    ({"parallel.sequence_parallel": False}, False),
    ({"parallel.tensor": 1}, False),
    ({"parallel.pipe": 2, "train.global_batch_size": 32}, False),
    ({"tuning.scan_layers": True}, False),
    ({"tuning.tp_comm_overlap": True, "train.global_batch_size": 64}, True),   # as given
    ({"tuning.tp_comm_overlap": False}, False),
])
def test_resolved_from_the_config(ov, on):
    assert cfg(**ov).tp_comm_overlap_on is on


def test_auto_needs_gpus_of_one_process():
    c = cfg()
    assert tp_overlap_on(c, fake_mesh((1, 1, 4)))
    assert not tp_overlap_on(c, fake_mesh((1, 1, 4), platform="cpu"))
    # each GPU its own process (one process a GPU): the tensor group spans processes
    assert not tp_overlap_on(c, fake_mesh((1, 1, 4), processes=[0, 1, 2, 3]))
    # two hosts of 2 GPUs, data across hosts: each tensor group inside one
    c2 = cfg(**{"parallel.tensor": 2, "parallel.data": 2, "train.micro_batch_size": 8})
    assert tp_overlap_on(c2, fake_mesh((2, 1, 2), processes=[0, 0, 1, 1]))
    assert not tp_overlap_on(c2, fake_mesh((2, 1, 2), processes=[0, 1, 0, 1]))
    # true is taken as given, wherever it runs
    assert tp_overlap_on(cfg(**{"tuning.tp_comm_overlap": True}), fake_mesh((1, 1, 4), "cpu"))


def test_peer_mode_where_the_ring_runs():
    assert compiler_options(cfg(), fake_mesh((1, 1, 4)))["xla_gpu_collective_permute_mode"] \
        == PERMUTE_PEER_MODE == "COLLECTIVES_PEER_MEMORY"
    for c in (cfg(**{"tuning.tp_comm_overlap": False}), cfg(**{"train.global_batch_size": 32})):
        assert "xla_gpu_collective_permute_mode" not in compiler_options(c, fake_mesh((1, 1, 4)))


def test_cpu_keeps_gspmd_collectives():
    import jax
    mesh = jax.make_mesh((1, 1, 2), ("data", "pipe", "tensor"))
    c = cfg(**{"parallel.tensor": 2})
    assert c.tp_comm_overlap_on and not Sharder.for_config(c, mesh).tp_overlap
    assert compiler_options(c, mesh) == {}


@pytest.mark.parametrize("value", ["sometimes", "ring"])
def test_bad_values_are_refused_before_compiling(value):
    with pytest.raises(ConfigError, match=r"tuning.tp_comm_overlap must be true, false or auto"):
        validate(cfg(**{"tuning.tp_comm_overlap": value}))


def test_the_old_sends_key_loads_with_a_warning():
    """parallel.tp_overlap_sends is gone (each block goes straight to every rank): an old
    value of either kind loads, with one warning that says so."""
    with pytest.warns(UserWarning, match=r"parallel.tp_overlap_sends is gone: the tensor ring "
                                         r"sends each block straight to every rank"):
        assert cfg(**{"parallel.tp_overlap_sends": "ring"}) == cfg()
