"""What a new user trips over gets one clear message and the right exit code: malformed
command-line values, duplicated YAML keys, overwrites, damaged checkpoints, token ids of
an export trained on BPE data, and a tokenizer that does not fit the model."""
import subprocess
import sys

import pytest

import helpers_ckpt as H
from ptdp_jax.config import ConfigError, parse_cli_overrides
from ptdp_jax.exits import ExitCode


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, *map(str, args)], cwd=H.REPO, capture_output=True,
                          text=True, timeout=timeout, env=H.subprocess_env(JAX_PLATFORMS="cpu"))


def _clean(r, code):
    """Exit `code`, no traceback, one line of stderr (jax's and orbax's warnings aside)."""
    assert r.returncode == code, (r.returncode, r.stderr[-3000:])
    assert "Traceback" not in r.stderr and "Error:" not in r.stderr.replace(
        "config error:", "").replace("checkpoint error:", ""), r.stderr[-3000:]


# ----------------------------------------------------------------------------- overrides

@pytest.mark.parametrize("item", ["data.path=[data/x", "train.lr={"])
def test_malformed_override_value_is_a_config_error(item):
    key, value = item.split("=", 1)
    with pytest.raises(ConfigError) as e:
        parse_cli_overrides(["train.steps=2", item])
    assert key in str(e.value) and repr(value) in str(e.value)
    for tool in (["-m", "ptdp_jax.cli", "configs/tiny-gpt.yaml", "--print-config"],
                 ["-m", "ptdp_jax.evaluate", "no-such-checkpoint"],
                 ["-m", "ptdp_jax.plan.cli", "configs/tiny-gpt.yaml", "--gpus", "8"]):
        r = _run(*tool, item)
        _clean(r, ExitCode.CONFIG)
        assert f"config error: override {item}: cannot parse {value!r}" in r.stderr, r.stderr
