"""parallel.nccl_channels: NCCL's least channels a collective runs on, set through the
environment before the first step runs (NCCL reads it when it makes its first communicator)."""
from types import SimpleNamespace

import numpy as np
import pytest

from ptdp_jax.config import ConfigError, load_config, parse_cli_overrides
from ptdp_jax.step import nccl_environment
from ptdp_jax.validation import validate


def gpu_mesh():
    """What nccl_environment reads of a mesh: the platform of its devices."""
    return SimpleNamespace(devices=np.array([SimpleNamespace(platform="gpu")]))


def cfg(**ov):
    return load_config(overrides=ov)


@pytest.mark.parametrize("tensor, value, channels", [
    (1, "auto", 0), (2, "auto", 64), (4, "auto", 64), (4, 0, 0), (1, 32, 32), (4, 16, 16)])
def test_resolved_channels(tensor, value, channels):
    c = cfg(**{"parallel.tensor": tensor, "parallel.nccl_channels": value})
    assert c.parallel.nccl_channels_value == channels
    env = nccl_environment(c, gpu_mesh(), environ={})
    assert env == ({"NCCL_MIN_NCHANNELS": str(channels)} if channels else {})


def test_a_variable_already_set_wins():
    c = cfg(**{"parallel.tensor": 4})
    assert nccl_environment(c, gpu_mesh(), environ={"NCCL_MIN_NCHANNELS": "8"}) == {}
    assert nccl_environment(c, gpu_mesh(), environ={"NCCL_DEBUG": "INFO"}) == \
        {"NCCL_MIN_NCHANNELS": "64"}


def test_nothing_off_the_gpu():
    import jax
    mesh = jax.make_mesh((1, 1, 1), ("data", "pipe", "tensor"))
    assert nccl_environment(cfg(**{"parallel.nccl_channels": 32}), mesh, environ={}) == {}


def test_command_line_value():
    c = load_config(overrides=parse_cli_overrides(["parallel.nccl_channels=48"]))
    assert c.parallel.nccl_channels_value == 48


@pytest.mark.parametrize("value", [-1, 65, "many", True])
def test_bad_values_are_refused_before_compiling(value):
    with pytest.raises(ConfigError, match=r"parallel.nccl_channels must be auto or a number of "
                                          r"channels from 0 \(NCCL's own\) to 64, got"):
        validate(cfg(**{"parallel.nccl_channels": value}))
