"""run.compile_cache: the compiled train step kept on disk, so that a run started again with
the same config (a resume, a run after --dry-run) compiles nothing new."""
import importlib.util
import os
import subprocess

import jax
import pytest

import helpers_ckpt as H
from ptdp_jax.compile_cache import default_dir, use_compile_cache
from ptdp_jax.config import ConfigError, load_config
from ptdp_jax.validation import validate


@pytest.fixture
def jax_cache_config():
    """JAX's cache settings restored after the test (they are process-wide)."""
    keys = ("jax_compilation_cache_dir", "jax_enable_compilation_cache",
            "jax_compilation_cache_max_size")
    before = {k: getattr(jax.config, k) for k in keys}
    yield
    for k, v in before.items():
        jax.config.update(k, v)


def test_settings(tmp_path, monkeypatch, jax_cache_config):
    assert use_compile_cache(str(tmp_path / "c")) == str(tmp_path / "c")
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "c")
    assert use_compile_cache("auto") == str(tmp_path / "c")     # a directory already set stays
    jax.config.update("jax_compilation_cache_dir", None)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    jax.config.update("jax_compilation_cache_max_size", -1)
    assert use_compile_cache("auto") == str(tmp_path / "xdg" / "ptdp_jax" / "xla") == default_dir()
    bounded = importlib.util.find_spec("filelock") is not None      # JAX evicts with it only
    assert jax.config.jax_compilation_cache_max_size == (8 * 2 ** 30 if bounded else -1)
    assert jax.config.jax_enable_compilation_cache
    assert use_compile_cache("off") is None
    assert not jax.config.jax_enable_compilation_cache


def test_empty_setting_is_refused_before_compiling():
    with pytest.raises(ConfigError, match="run.compile_cache must be auto, off or a directory"):
        validate(load_config(overrides={"run.compile_cache": " "}))


def _cached_files(d):
    return sorted(p for p in os.listdir(d)) if os.path.isdir(d) else []


def test_a_second_run_compiles_nothing_new(tmp_path, data_cache):
    """Two CLI processes, the same config: the first fills the cache (and says where it is),
    the second finds every program there."""
    cache = tmp_path / "xla"
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 2, "run.compile_cache": str(cache),
                                         "checkpoint.every": 0})
    runs = []
    for i in range(2):
        ov["run.dir"] = str(tmp_path / f"run{i}")
        ov["checkpoint.dir"] = str(tmp_path / f"ckpt{i}")
        env = H.subprocess_env(JAX_LOG_COMPILES="1")      # logs the cache's hits
        r = subprocess.run(H.cli_command(ov), cwd=H.REPO, env=env, text=True,
                           capture_output=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        runs.append((r.stdout + r.stderr, _cached_files(cache)))
    (out1, files1), (out2, files2) = runs
    assert f"compilation cache: {cache}" in out1
    assert files1, "the first run wrote no compiled program"
    hit = "Persistent compilation cache hit for 'jit_step_fn'"
    assert hit not in out1 and hit in out2        # the train step came from the cache
    assert files2 == files1                       # and nothing was compiled again
