"""One run at a time in a checkpoint.dir: a second run (another process, or this one while
the lock is held) is refused at its start, before compiling, with one line naming the
directory and the holder's pid and host (exit 6); the lock file is no foreign file to the
directory checks, and it is gone once the run returns."""
import importlib
import json
import os
import socket
import subprocess
import sys

import pytest

import helpers_ckpt as H
from ptdp_jax.checkpoint import lock as LK, manager as CK
from ptdp_jax.checkpoint.format import LOCK_FILE, _scan, check_directory
from ptdp_jax.cli.train import main as cli_main
from ptdp_jax.exits import ExitCode
from ptdp_jax.run.dry_run import dry_run
from ptdp_jax.run.loop import train

T = importlib.import_module("ptdp_jax.run.loop")
HOLD = ("import sys; from pathlib import Path; from ptdp_jax.checkpoint import lock; "
        "lock.acquire(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()")


def _no_compile(*args, **kwargs):
    raise AssertionError("compiled while another run holds checkpoint.dir")


def test_a_second_run_is_refused_before_compiling(tmp_path, data_cache, capsys, monkeypatch):
    """Another process holds checkpoint.dir: ptdp-train exits 6 with one line naming the
    directory and that process's pid and host, before anything compiles; once that process
    is gone (here without releasing, as a killed run) the lock is taken over."""
    ckpt = tmp_path / "ckpt"
    env = {**os.environ, "PYTHONPATH": str(H.REPO), "JAX_PLATFORMS": "cpu"}
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(ckpt)], env=env, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout.readline().strip() == "held"
        monkeypatch.setattr(T, "compile_all", _no_compile)
        ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2})
        rc = cli_main(["--mesh", "1,1,1", "--dry-run", *(f"{k}={v}" for k, v in ov.items())])
        err = capsys.readouterr().err
        assert rc == ExitCode.CHECKPOINT and len(err.strip().splitlines()) == 1, err
        assert f"checkpoint.dir {ckpt} is in use by another run (pid {holder.pid} on host " \
               f"{socket.gethostname()} since " in err
        assert _scan(ckpt) == ([], [], [])              # the lock is no foreign file
        check_directory(ckpt)
    finally:
        holder.communicate("", timeout=60)
    assert json.loads((ckpt / LOCK_FILE).read_text())["pid"] == holder.pid   # not released
    LK.acquire(ckpt)                                    # as a killed run's: taken over
    assert json.loads((ckpt / LOCK_FILE).read_text())["pid"] == os.getpid()
    LK.release(ckpt)
    assert not (ckpt / LOCK_FILE).exists()


def test_the_lock_is_held_for_the_run_and_released_at_return(tmp_path, data_cache):
    """While this process holds the lock, train() is refused (CheckpointError naming this
    pid) and the checkpoint checks see no foreign file; a run takes the lock itself and
    leaves none behind, so the next run in the same process starts."""
    ov = H.tiny(tmp_path, data_cache, **{"model.num_layers": 2, "train.steps": 2})
    ckpt = tmp_path / "ckpt"
    LK.acquire(ckpt)
    try:
        cfg = T.resolve_config(None, (1, 1, 1), ov)
        assert CK.check_checkpoint_dir(cfg) == []
        with pytest.raises(CK.CheckpointError, match=f"is in use by another run \\(pid "
                                                     f"{os.getpid()} on host "):
            train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    finally:
        LK.release(ckpt)
    assert not (ckpt / LOCK_FILE).exists()
    held = []                                            # the lock file at each step's line
    res = train(mesh_shape=(1, 1, 1), overrides=ov, log=lambda *a: held.append(
        (ckpt / LOCK_FILE).is_file()) if str(a[0]).startswith("step ") else None)
    assert len(res.losses) == 2 and held and all(held)
    assert sorted(p.name for p in ckpt.iterdir()) == ["2"]
    dry_run(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    assert not (ckpt / LOCK_FILE).exists() and not LK._HELD
