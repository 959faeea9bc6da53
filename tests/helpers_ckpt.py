"""Shared helpers of the checkpoint, fault and export tests."""
from __future__ import annotations

import os
import re
import signal
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

# Persistent compilation cache: the many train() calls of these tests compile the same
# programs (same config and mesh) again; with the cache a resumed run reuses them.
JAX_CACHE = os.environ.get("PTDP_TEST_JAX_CACHE") or os.path.join(
    tempfile.gettempdir(), f"ptdp_jax_test_jax_cache_{os.getuid()}")
jax.config.update("jax_compilation_cache_dir", JAX_CACHE)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.3)

REPO = Path(__file__).resolve().parents[1]


def tiny(tmp_path, data_cache, **extra) -> dict:
    """Overrides of a small GPT run writing under tmp_path (the corpus cached in data_cache,
    conftest's fixture: $PTDP_CACHE_DIR)."""
    ov = {
        "model.arch": "gpt", "model.num_layers": 4, "model.hidden_size": 32, "model.num_heads": 4,
        "model.seq_len": 16, "train.global_batch_size": 8, "train.micro_batch_size": 1,
        "train.steps": 6, "train.warmup_steps": 1, "train.eval_every": 0,
        "train.sample_tokens": 0, "run.dir": str(Path(tmp_path) / "run"),
        "checkpoint.dir": str(Path(tmp_path) / "ckpt"),
    }
    ov.update(extra)
    return ov


class Log:
    """A train(log=...) callback that keeps the lines and sends `sig` to this process while
    step `at` is in flight, so that train() ends that step, checkpoints and returns, as on a
    real SIGTERM: with the run's header if the run starts at step at - 1, else when the line
    of step at - 1 is logged (train() has dispatched step `at` by then: it dispatches ahead;
    without a progress bar it logs steps 1, 10, 20, ...)."""

    def __init__(self, at: int | None = None, sig=signal.SIGTERM):
        self.lines: list[str] = []
        self.at, self.sig = at, sig
        self.start = 0

    def __call__(self, *args, **kw):
        line = " ".join(str(a) for a in args)
        self.lines.append(line)
        resumed = re.match(r"resumed from .* at step (\d+)", line)
        if resumed:
            self.start = int(resumed.group(1))
        if self.at is None:
            return
        header = line.startswith("ptdp_jax: ") and "metrics in" in line
        if line.startswith(f"step {self.at - 1}/") or (header and self.start == self.at - 1):
            os.kill(os.getpid(), self.sig)

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


def subprocess_env(**extra) -> dict:
    env = dict(os.environ)
    env.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8 "
                                "--xla_backend_optimization_level=0")
    env["JAX_COMPILATION_CACHE_DIR"] = JAX_CACHE
    env["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0.3"
    env["PYTHONUNBUFFERED"] = "1"
    env["PTDP_NO_DISTRIBUTED"] = "1"
    env.pop("PTDP_TEST_SAVE_DELAY", None)
    env.pop("PTDP_TEST_SAVE_FAULT", None)
    env.update(extra)
    return env


def cli_command(overrides: dict, mesh="1,1,1") -> list[str]:
    return [sys.executable, "-m", "ptdp_jax.cli.train", "--mesh", mesh] + \
        [f"{k}={v}" for k, v in overrides.items()]


def snapshot(directory: Path) -> dict:
    """Every file under directory with its size and mtime (to prove nothing changed)."""
    out = {}
    for p in sorted(Path(directory).rglob("*")):
        st = p.stat()
        out[str(p.relative_to(directory))] = (p.is_dir(), st.st_size if p.is_file() else 0,
                                              st.st_mtime_ns)
    return out


def damage_moments(step_dir) -> int:
    """Overwrite the stored bytes of every AdamW moment array (the 'opt.' keys held outside the
    OCDBT index: all but the smallest) of a step directory with 0xff, which no longer
    decompresses; the parameters' bytes, which may share a data file with them, stay intact.
    Returns the number of arrays damaged."""
    import tensorstore as ts
    state = Path(step_dir) / "state"
    base = ts.KvStore.open({"driver": "file", "path": f"{state}/"}).result()
    version = ts.ocdbt.dump(base).result()["versions"][-1]
    assert version["root_height"] == 0, "a tiny checkpoint's index is one node"
    damaged = 0
    for entry in ts.ocdbt.dump(base, version["root"]["location"]).result()["entries"]:
        if entry["key"].startswith(b"opt.") and "indirect_value" in entry:
            _, prefix, name, offset, size = entry["indirect_value"].split(":")
            with open(state / prefix / name, "r+b") as f:
                f.seek(int(offset))
                f.write(b"\xff" * int(size))
            damaged += 1
    return damaged


def trees_equal(a, b) -> bool:
    """Same structure and bit-identical leaves."""
    import jax
    import numpy as np
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


def same_up_to_rounding(a, b) -> None:
    """a == b but for float32 rounding: within 1e-6 of b's largest element (two programs
    of the same sums, which XLA may fuse and vectorize differently on another CPU)."""
    a, b = np.asarray(a), np.asarray(b)
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6 * float(np.abs(b).max(initial=0.0)))


def assert_resume_exact(overrides: dict, mesh, at: int = 3, exact: bool = True) -> None:
    """The run of `overrides` in one go == the same stopped after step `at` and resumed:
    the losses and parameters exactly equal (checkpoint.every must save step `at`); exact
    False: up to float32 rounding (`same_up_to_rounding`), where the resumed run compiles
    other programs (delayed FP8's first step after a resume)."""
    from ptdp_jax.run.loop import train
    base = train(mesh_shape=mesh, overrides={**overrides, "checkpoint.dir": ""}, log=Log())
    first = train(mesh_shape=mesh, overrides={**overrides, "train.stop_at_step": at}, log=Log())
    second = train(mesh_shape=mesh, overrides=overrides, log=Log())
    assert second.start_step == at
    if exact:
        assert first.losses + second.losses == base.losses
        assert trees_equal(second.params, base.params)
        return
    same_up_to_rounding(first.losses + second.losses, base.losses)
    for a, b in zip(jax.tree.leaves(second.params), jax.tree.leaves(base.params)):
        same_up_to_rounding(a, b)
