"""What a new user trips over gets one clear message and the right exit code: malformed
command-line values, duplicated YAML keys, overwrites, damaged checkpoints, token ids of
an export trained on BPE data, and a tokenizer that does not fit the model."""
import shutil
import subprocess
import sys

import pytest

import helpers_ckpt as H
from ptdp_jax.config import ConfigError, parse_cli_overrides
from ptdp_jax.exits import ExitCode


@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache):
    """A tiny GPT trained 2 steps on the embedded byte corpus: checkpoints 1 and 2."""
    from ptdp_jax.train import train
    tmp = tmp_path_factory.mktemp("trained")
    ov = H.tiny(tmp, data_cache, **{"train.steps": 2, "checkpoint.every": 1,
                                    "model.num_layers": 2})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    return tmp / "ckpt", ov


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


# ----------------------------------------------------------------------------- overwrites

def test_prepare_data_refuses_to_overwrite(tmp_path, capsys):
    from ptdp_jax.data import TokenDataset
    from ptdp_jax.data.prepare import main
    (tmp_path / "a.txt").write_text("first text " * 20)
    (tmp_path / "b.txt").write_text("second, longer text " * 40)
    out = tmp_path / "ds"
    assert main([str(tmp_path / "a.txt"), "--out", str(out)]) == 0
    before = H.snapshot(tmp_path)
    for extra in ([], ["--tokenizer", "bpe", "--vocab-size", "300"]):
        with pytest.raises(SystemExit) as e:
            main([str(tmp_path / "b.txt"), "--out", str(out), *extra])
        assert e.value.code == ExitCode.CONFIG
        err = capsys.readouterr().err
        assert f"--out '{out}': a dataset is already there" in err and "--overwrite" in err
        assert H.snapshot(tmp_path) == before
    assert main([str(tmp_path / "b.txt"), "--out", str(out), "--overwrite"]) == 0
    assert TokenDataset(out).num_tokens == len("second, longer text " * 40) + 1


def test_export_refuses_to_overwrite(trained, tmp_path, capsys):
    from ptdp_jax import export as EX
    ckpt, _ = trained
    out = tmp_path / "hf"
    assert EX.main([str(ckpt), str(out)]) == 0
    before = H.snapshot(out)
    assert EX.main([str(ckpt / "1"), str(out)]) == ExitCode.CONFIG
    err = capsys.readouterr().err
    assert f"'{out}' already holds an export (config.json," in err and "--overwrite" in err
    assert H.snapshot(out) == before
    assert EX.main([str(ckpt / "1"), str(out), "--overwrite"]) == 0
    assert H.snapshot(out) != before
