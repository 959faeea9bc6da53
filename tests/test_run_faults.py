"""What a run does when a device runs out of memory or a checkpoint cannot be written: one
line naming the phase, the step and the cause, a documented exit code, the full text in
run.dir/errors.log, and the last good checkpoint intact; and a disk too small for the run's
checkpoints refused before compiling."""
import shutil
import subprocess
from pathlib import Path

import jax.numpy as jnp
import pytest

import helpers_ckpt as H
from ptdp_jax.checkpoint import manager as CK
from ptdp_jax.checkpoint import saving as SV
from ptdp_jax.config.load import load_config
from ptdp_jax.exits import ExitCode
from ptdp_jax.parallel.sharding import make_mesh
from ptdp_jax.run.loop import resolve_config, train
from ptdp_jax.training.state import make_optimizer
from ptdp_jax.training.step import compile_all


def _cli(tmp_path, data_cache, **env):
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 6, "train.eval_every": 2,
                                          "checkpoint.every": 2})
    return subprocess.run(H.cli_command(ov), cwd=H.REPO, env=H.subprocess_env(**env),
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("phase,step,survivor", [("train", 3, 2), ("eval", 4, 2),
                                                 ("checkpoint", 4, 2)])
def test_out_of_memory_is_one_line_per_phase(tmp_path, data_cache, phase, step, survivor):
    r = _cli(tmp_path, data_cache, PTDP_TEST_OOM=f"{phase}:{step}")
    assert r.returncode == ExitCode.OUT_OF_MEMORY, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in r.stderr + r.stdout, r.stderr
    assert f"out of device memory at step {step}, in " in lines[0]
    assert {"train": "the train step", "eval": "the evaluation",
            "checkpoint": "the checkpoint's copy"}[phase] in lines[0]
    assert "XLA asked for 36.19 GiB" in lines[0] and "To fit:" in lines[0]
    ckpt = tmp_path / "ckpt"
    assert f"the previous checkpoint (step {survivor}) is intact: {ckpt / str(survivor)}" \
        in lines[0]
    assert sorted(p.name for p in ckpt.iterdir()) == [str(survivor)]
    CK.load_checkpoint(ckpt / str(survivor))                        # complete and loadable
    log = (tmp_path / "run" / "errors.log").read_text()
    assert "Traceback" in log and "RESOURCE_EXHAUSTED" in log


def test_a_failed_write_is_one_line_without_orbax_tracebacks(tmp_path, data_cache):
    r = _cli(tmp_path, data_cache, PTDP_TEST_SAVE_FAULT="enospc:4")
    assert r.returncode == ExitCode.CHECKPOINT
    assert r.stderr.strip().splitlines() == [
        f"ptdp-train: checkpoint error: checkpoint save of step 4 to {tmp_path / 'ckpt'} failed "
        f"(disk full: [Errno 28] No space left on device); the previous checkpoint (step 2) "
        f"is intact: {tmp_path / 'ckpt' / '2'}"]
    assert "Traceback" in (tmp_path / "run" / "errors.log").read_text()    # kept, not shown


@pytest.mark.parametrize("error,cause", [
    (OSError(28, "No space left on device"), "disk full"),
    (PermissionError(13, "Permission denied"), "permission denied"),
    (ValueError("RESOURCE_EXHAUSTED: Error writing: Failed writing: No space left on device "
                "[os_error_code='28']"), "disk full"),
    (FileNotFoundError(2, "No such file or directory"), "the directory vanished"),
    (RuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 1.0GiB"),
     "out of device memory"),
    (RuntimeError("something else"), "write failed")])
def test_a_failed_write_names_its_cause(error, cause):
    assert SV.failure_cause(error) == cause
    wrapped = RuntimeError("orbax's wrapper")
    wrapped.__cause__ = error
    assert SV.failure_cause(wrapped) == cause


def test_a_vanished_directory_is_said_at_the_next_save(tmp_path, data_cache):
    ov = H.tiny(tmp_path, data_cache)
    cfg = resolve_config(None, (1, 1, 1), ov)
    compiled = compile_all(cfg, make_mesh((1, 1, 1)), make_optimizer(cfg)[0])
    state = compiled.init()
    m = CK.CheckpointManager(cfg, compiled.shardings)
    m.save(2, dict(state, step=jnp.int32(2)))
    m.wait()
    shutil.rmtree(tmp_path / "ckpt")
    with pytest.raises(CK.CheckpointError, match=r"save of step 4 failed \(the directory "
                                                 r"vanished: .*ckpt no longer exists\)"):
        m.save(4, dict(state, step=jnp.int32(4)))
    m.close()


def test_the_runs_checkpoints_are_counted():
    cfg = load_config(overrides={"train.steps": 30, "checkpoint.every": 15,
                                 "checkpoint.keep": 3, "checkpoint.dir": "x"})
    assert SV.saves_in_run(cfg, 0) == 2 and SV.saves_in_run(cfg, 15) == 1
    assert SV.saves_in_run(cfg, 30) == 0
    assert SV.disk_need(cfg, 10, 0, 0) == (2, 20)              # two, both kept
    assert SV.disk_need(cfg, 10, 3, 0) == (2, 10)              # three kept: one more at once
    odd = load_config(overrides={"train.steps": 31, "checkpoint.every": 15})
    assert SV.saves_in_run(odd, 0) == 3                        # 15, 30 and the last, 31
    keep1 = load_config(overrides={"train.steps": 100, "checkpoint.every": 10,
                                   "checkpoint.keep": 1})
    assert SV.disk_need(keep1, 10, 0, 0) == (10, 20)           # the new one before the old goes


def test_a_disk_too_small_is_refused_before_compiling(tmp_path, data_cache, monkeypatch):
    ov = H.tiny(tmp_path, data_cache, **{"train.steps": 4, "checkpoint.every": 2})
    cfg = load_config(overrides=ov)
    per = SV.checkpoint_bytes(CK.canonical_abstract_state(cfg, make_optimizer(cfg)[0]))
    monkeypatch.setattr(SV, "free_bytes", lambda d: int(per * 1.5))
    lines = []
    with pytest.raises(CK.CheckpointError) as e:
        train(mesh_shape=(1, 1, 1), overrides=ov, log=lines.append)
    assert not any("compiling" in line for line in lines)
    msg = str(e.value)
    assert f"a checkpoint of this run is {per / 1e9:.1f} GB" in msg
    assert "this run writes 2 (checkpoint.every=2, train.steps=4)" in msg
    assert "checkpoint.keep=3" in msg and "2 more at once" in msg
    monkeypatch.setattr(SV, "free_bytes", lambda d: int(per * 2.5))
    assert len(train(mesh_shape=(1, 1, 1), overrides=ov, log=lines.append).losses) == 4


def test_offload_out_of_host_memory_is_said(monkeypatch):
    """An allocation the device had room for that fails under train.recompute=offload is the
    host's pinned memory (XLA's host allocator), said as such, with what to change."""
    from ptdp_jax.run import phases
    monkeypatch.setattr(phases, "_in_use_and_limit", lambda: (32 * 2**30, 128 * 2**30, "gpu"))
    text = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 85.31GiB."
    line = lambda r: phases.describe("train", 1, load_config(
        "configs/tiny-llama.yaml", {"train.recompute": r}), text)
    assert line("offload").startswith(
        "out of pinned host memory at step 1, in the train step (XLA asked for 85.31 GiB "
        "while the device had 96.00 GiB free)")
    assert "train.recompute=full" in line("offload")
    assert line("selective").startswith("out of device memory at step 1")
