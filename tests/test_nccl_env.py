"""decisions.nccl_environment: NCCL's least channels a collective runs on (64 with tensor > 1 on
GPUs), set through the environment before the first step runs (NCCL reads it when it makes
its first communicator); the variable itself, set by the user, is the override."""
from types import SimpleNamespace

import numpy as np
import pytest

from ptdp_jax.config.load import load_config, parse_cli_overrides
from ptdp_jax.training.step import nccl_environment


def gpu_mesh():
    """What nccl_environment reads of a mesh: the platform of its devices."""
    return SimpleNamespace(devices=np.array([SimpleNamespace(platform="gpu")]))


def cfg(**ov):
    return load_config(overrides=ov)


@pytest.mark.parametrize("tensor, channels", [(1, 0), (2, 64), (4, 64)])
def test_rule_by_tensor(tensor, channels):
    env = nccl_environment(cfg(**{"parallel.tensor": tensor}), gpu_mesh(), environ={})
    assert env == ({"NCCL_MIN_NCHANNELS": str(channels)} if channels else {})


def test_a_variable_already_set_wins():
    c = cfg(**{"parallel.tensor": 4})
    assert nccl_environment(c, gpu_mesh(), environ={"NCCL_MIN_NCHANNELS": "8"}) == {}
    assert nccl_environment(c, gpu_mesh(), environ={"NCCL_DEBUG": "INFO"}) == \
        {"NCCL_MIN_NCHANNELS": "64"}


def test_nothing_off_the_gpu():
    import jax
    mesh = jax.make_mesh((1, 1, 1), ("data", "pipe", "tensor"))
    assert nccl_environment(cfg(**{"parallel.tensor": 4}), mesh, environ={}) == {}


def test_the_old_key_loads_with_a_warning_naming_the_variable():
    with pytest.warns(UserWarning, match=r"parallel.nccl_channels is gone: 64 NCCL channels "
                                         r"with tensor > 1 .* NCCL_MIN_NCHANNELS in the "
                                         r"environment overrides it"):
        c = load_config(overrides=parse_cli_overrides(["parallel.nccl_channels=48"]))
    assert c == cfg()
