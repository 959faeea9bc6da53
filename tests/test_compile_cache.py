"""run.compile_cache: the compiled train step kept on disk, so that a run started again with
the same config (a resume, a run after --dry-run) compiles nothing new."""
import importlib.util
import os
import subprocess

import jax
import pytest

import helpers_ckpt as H
from ptdp_jax.training.compile_cache import default_dir, use_compile_cache
from ptdp_jax.config.load import ConfigError, load_config, parse_cli_overrides
from ptdp_jax.config.validation import validate


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
    assert use_compile_cache(True) == default_dir() and jax.config.jax_enable_compilation_cache
    assert use_compile_cache(False) is None and not jax.config.jax_enable_compilation_cache


@pytest.mark.parametrize("text, value", [("off", False), ("false", False), ("auto", "auto"),
                                         ("true", True), ("/tmp/xla cache", "/tmp/xla cache")])
def test_command_line_values(text, value):
    """`off` is YAML's false on the command line: it must turn the cache off, not name a
    directory 'False'."""
    cfg = load_config(overrides=parse_cli_overrides([f"run.compile_cache={text}"]))
    assert cfg.run.compile_cache == value


def test_empty_setting_is_refused_before_compiling():
    with pytest.raises(ConfigError, match="run.compile_cache must be auto, off or a directory"):
        validate(load_config(overrides={"run.compile_cache": " "}))


def _cached_files(d):
    return sorted(p for p in os.listdir(d)) if os.path.isdir(d) else []


def test_a_second_run_compiles_nothing_new(tmp_path, data_cache):
    """CLI processes with the same config: the first fills the cache (and says where it is),
    the second finds every program there, a third with `off` neither reads nor writes one."""
    cache = tmp_path / "xla"
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 2, "checkpoint.every": 0})
    runs = []
    for i, setting in enumerate([str(cache), str(cache), "off"]):
        ov.update({"run.dir": str(tmp_path / f"run{i}"),
                   "checkpoint.dir": str(tmp_path / f"ckpt{i}"),
                   "run.compile_cache": setting})
        # JAX_LOG_COMPILES logs the cache's hits; JAX caches only programs that took at least
        # jax_persistent_cache_min_compile_time_secs (0.3 s in helpers_ckpt's environment) to
        # compile, and on a loaded 2-core machine the eval program may cross it in one run and
        # not in the other: cache them all
        env = H.subprocess_env(JAX_LOG_COMPILES="1", JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
        r = subprocess.run(H.cli_command(ov), cwd=tmp_path, env=env, text=True,
                           capture_output=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        runs.append((r.stdout + r.stderr, _cached_files(cache)))
    (out1, files1), (out2, files2), (out3, files3) = runs
    assert f"compilation cache: {cache}" in out1
    assert files1, "the first run wrote no compiled program"
    hit = "Persistent compilation cache hit for 'jit_step_fn'"
    assert hit not in out1 and hit in out2        # the train step came from the cache
    assert files2 == files1                       # and nothing was compiled again
    assert "compilation cache" not in out3 and hit not in out3 and files3 == files1
    assert not (tmp_path / "False").exists() and not (tmp_path / "off").exists()   # cwd
