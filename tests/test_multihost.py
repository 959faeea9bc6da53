"""Multi-process runs on one CPU machine: 2 real processes x 4 fake CPU devices, each a
`ptdp-train` (tests/multihost_worker.py) joined through jax.distributed on localhost
(gloo collectives), against single-process runs on the 8 devices of this process.

- the losses and final parameters of 2 processes equal those of 1 process, on mesh
  (2, 2, 2) interleaved and (2, 1, 4); each process reads only its own rows; only
  process 0 logs and writes metrics;
- checkpoints written by 2 processes restore in 1 and the reverse, continuing exactly;
- a process killed mid-run makes the other exit within 60 s naming the lost process;
  a restart resumes from the last complete checkpoint.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest

import helpers_ckpt as H      # noqa: F401  (persistent compilation cache for the in-process runs)
from ptdp_jax.parallel import distributed as DIST
from ptdp_jax.config.load import ConfigError
from ptdp_jax.run.loop import train

WORKER = Path(__file__).with_name("multihost_worker.py")
N_PROC, LOCAL_DEVICES = 2, 4
B = 8                                           # global batch
RUN_TIMEOUT = 240                               # s, one multi-process run (start to exit)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def tiny(tmp_path, data_cache, **extra) -> dict:
    ov = {"model.num_layers": 4, "model.hidden_size": 32, "model.num_heads": 4,
          "model.seq_len": 16, "train.global_batch_size": B, "train.micro_batch_size": 1,
          "train.steps": 3, "train.warmup_steps": 1, "train.eval_every": 0, "train.sample_tokens": 0,
          "run.dir": str(Path(tmp_path) / "run")}
    ov.update(extra)
    return ov


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def worker_env() -> dict:
    env = dict(os.environ)
    flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "",
                   env.get("XLA_FLAGS", "--xla_backend_optimization_level=0"))
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={LOCAL_DEVICES} {flags}".strip()
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONUNBUFFERED"] = "1"
    env["TF_CPP_MIN_LOG_LEVEL"] = "1"           # XLA's warnings and errors, not its INFO lines
    for k in ("PTDP_NO_DISTRIBUTED", "PTDP_TEST_SAVE_DELAY", "PTDP_TEST_SAVE_FAULT",
              "PTDP_COORDINATOR", "PTDP_NUM_PROCESSES", "PTDP_PROCESS_ID",
              "JAX_COMPILATION_CACHE_DIR"):
        env.pop(k, None)
    return env


class Group:
    """N worker processes of one run; output in <dir>/proc<i>.log; killed on exit."""

    def __init__(self, out_dir: Path, mesh: str, overrides: dict, heartbeat: float = 10):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.procs: list[subprocess.Popen] = []
        self.t0 = time.monotonic()
        for i in range(N_PROC):
            cmd = [sys.executable, str(WORKER), str(self.dir), "--mesh", mesh,
                   "--coordinator", f"localhost:{port}", "--num-processes", str(N_PROC),
                   "--process-id", str(i), "--heartbeat-timeout", str(heartbeat),
                   "--init-timeout", "120"] + [f"{k}={v}" for k, v in overrides.items()]
            with open(self.dir / f"proc{i}.log", "w") as log:
                self.procs.append(subprocess.Popen(cmd, cwd=H.REPO, env=worker_env(), stdout=log,
                                                   stderr=subprocess.STDOUT))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.kill()

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass

    def wait(self, timeout: float = RUN_TIMEOUT) -> list[int]:
        """The exit codes; self.ended[i]: when process i was seen to end."""
        self.ended: dict[int, float] = {}
        while len(self.ended) < len(self.procs):
            self.ended.update({i: time.monotonic() for i, p in enumerate(self.procs)
                               if i not in self.ended and p.poll() is not None})
            if time.monotonic() > self.t0 + timeout:
                self.kill()
                raise AssertionError(f"multi-process run still running after {timeout} s:\n"
                                     + self.logs())
            time.sleep(0.05)
        return [p.returncode for p in self.procs]

    def log(self, i: int) -> str:
        return (self.dir / f"proc{i}.log").read_text()

    def logs(self) -> str:
        return "\n".join(f"--- process {i} ---\n{self.log(i)[-6000:]}" for i in range(N_PROC))

    def result(self, i: int) -> dict:
        return json.loads((self.dir / f"proc{i}.json").read_text())

    def params(self, i: int) -> dict:
        with np.load(self.dir / f"proc{i}.npz") as z:
            return dict(z)


def flat(params) -> dict:
    return {"/".join(str(getattr(k, "key", k)) for k in path): np.asarray(v)
            for path, v in jax.tree_util.tree_flatten_with_path(params)[0]}


def quiet(*a, **k):
    pass


def steps_in(ckpt: Path) -> list[int]:
    return sorted(int(p.name) for p in ckpt.iterdir() if p.name.isdigit()) if ckpt.exists() else []


def copy_ckpt(src: Path, dst: Path, upto: int) -> None:
    """dst: a copy of checkpoint dir src holding only its complete steps <= upto."""
    dst.mkdir(parents=True)
    for s in steps_in(src):
        if s <= upto:
            shutil.copytree(src / str(s), dst / str(s))


def rows_by_step(reads, split="train") -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for sp, idx in reads:
        if sp == split:
            for g in idx:
                out.setdefault(g // B, []).append(g)
    return out


LOSS_TOL = 1e-5           # float32 rounding: different reduction orders across processes


@pytest.mark.parametrize("mesh,extra,own_rows", [
    ("2,2,2", {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}, "all"),
    ("2,1,4", {}, "half"),
], ids=["2x2x2-interleaved", "2x1x4"])
def test_two_processes_match_one(tmp_path, data_cache, mesh, extra, own_rows, record_property):
    """Losses, validation loss and final parameters of 2 processes x 4 devices equal one
    process on 8 devices. Rows: 'tensor' stays inside a process, 'data' fills a host
    before 'pipe', so on (2,2,2) 'pipe' crosses hosts and both processes need every row,
    on (2,1,4) 'data' crosses hosts and each process reads its half, each row once."""
    shape = tuple(int(x) for x in mesh.split(","))
    t0 = time.monotonic()
    ref = train(mesh_shape=shape, log=quiet, overrides=tiny(tmp_path / "ref", data_cache, **extra))
    t_ref = time.monotonic() - t0
    with Group(tmp_path / "mp", mesh, tiny(tmp_path / "mp", data_cache, **extra)) as g:
        rcs = g.wait()
    t_mp = time.monotonic() - t0 - t_ref
    assert rcs == [0, 0], g.logs()
    res = [g.result(i) for i in range(N_PROC)]
    assert [r["process_index"] for r in res] == [0, 1]
    assert all(r["process_count"] == 2 and r["local_devices"] == 4 and r["devices"] == 8
               for r in res)
    # the same losses on every process; equal to one process within float rounding
    assert res[0]["losses"] == res[1]["losses"] and res[0]["val_losses"] == res[1]["val_losses"]
    diff = float(np.max(np.abs(np.array(res[0]["losses"]) - np.array(ref.losses))))
    vdiff = abs(res[0]["val_losses"][-1][1] - ref.val_losses[-1][1])
    p0, pref = g.params(0), flat(ref.params)
    assert sorted(p0) == sorted(pref)
    pdiff = max(float(np.max(np.abs(p0[k] - pref[k]))) for k in pref)
    # the final parameters are gathered to process 0 only
    assert not (g.dir / "proc1.npz").exists()
    print(f"\n[{mesh}] max |loss(2 proc) - loss(1 proc)| = {diff:.3g} over {len(ref.losses)} "
          f"steps; val {vdiff:.3g}; params {pdiff:.3g}; 1 proc {t_ref:.1f} s, 2 procs {t_mp:.1f} s")
    record_property("max_loss_diff", diff)
    assert len(res[0]["losses"]) == 3 and diff <= LOSS_TOL and vdiff <= LOSS_TOL
    assert pdiff <= 1e-5
    # rows: each process reads its own rows, each once per step
    for i, r in enumerate(res):
        by_step = rows_by_step(r["reads"])
        assert sorted(by_step) == [0, 1, 2]
        for step, rows in by_step.items():
            want = list(range(step * B, (step + 1) * B)) if own_rows == "all" else \
                list(range(step * B + i * B // 2, step * B + (i + 1) * B // 2))
            assert sorted(rows) == want, (i, step, rows)
    # logging, metrics: process 0 only
    log0, log1 = g.log(0), g.log(1)
    assert "step 1/3 loss" in log0 and "done: 3 steps" in log0 and "jax.distributed: 2" in log0
    assert "step 1/3" not in log1 and "done:" not in log1 and "ptdp_jax: gpt" not in log1
    metrics = [json.loads(line) for line in (tmp_path / "mp" / "run" / "metrics.jsonl")
               .read_text().splitlines()]
    assert [m["loss"] for m in metrics] == res[0]["losses"]
    # a clean end in order (distributed.finish): process 0, which runs the coordination
    # service, leaves last, and no process prints gRPC errors on the way out
    assert g.ended[1] < g.ended[0]
    for log in (log0, log1):
        assert "WatchTasksAsync" not in log and "CANCELLED" not in log, log


def test_checkpoints_cross_process_counts(tmp_path, data_cache):
    """A checkpoint written by 2 processes restores in 1 process and one written by 1
    process restores in 2; either way step 3 continues exactly as an uninterrupted
    single-process run."""
    mesh, shape = "2,1,4", (2, 1, 4)

    def ov(name):
        return tiny(tmp_path / name, data_cache, **{
            "checkpoint.dir": str(tmp_path / name / "ckpt"), "checkpoint.every": 2,
            "checkpoint.keep": 5})

    ref = train(mesh_shape=shape, log=quiet, overrides=ov("ref"))          # 1 process: 2, 3
    assert steps_in(tmp_path / "ref" / "ckpt") == [2, 3]
    # 2 processes write checkpoint 2 (and 3)
    with Group(tmp_path / "mp", mesh, ov("mp")) as g:
        assert g.wait() == [0, 0], g.logs()
    assert steps_in(tmp_path / "mp" / "ckpt") == [2, 3]
    assert np.max(np.abs(np.array(g.result(0)["losses"]) - ref.losses)) <= LOSS_TOL
    # 2 -> 1: one process resumes the 2-process checkpoint of step 2
    copy_ckpt(tmp_path / "mp" / "ckpt", tmp_path / "to1" / "ckpt", upto=2)
    log = H.Log()
    res1 = train(mesh_shape=shape, log=log, overrides=ov("to1"))
    assert res1.start_step == 2 and len(res1.losses) == 1, log.text
    assert abs(res1.losses[0] - ref.losses[2]) <= LOSS_TOL
    # 1 -> 2: two processes resume the 1-process checkpoint of step 2
    copy_ckpt(tmp_path / "ref" / "ckpt", tmp_path / "to2" / "ckpt", upto=2)
    with Group(tmp_path / "to2", mesh, ov("to2")) as g2:
        assert g2.wait() == [0, 0], g2.logs()
    r = g2.result(0)
    assert r["start_step"] == 2 and len(r["losses"]) == 1, g2.logs()
    assert f"resumed from {tmp_path / 'to2' / 'ckpt'} at step 2" in g2.log(0)
    assert abs(r["losses"][0] - ref.losses[2]) <= LOSS_TOL
    assert steps_in(tmp_path / "to2" / "ckpt") == [2, 3]
    p2, pref = g2.params(0), flat(ref.params)
    assert max(float(np.max(np.abs(p2[k] - pref[k]))) for k in pref) <= 1e-5


def test_killed_process_stops_the_other_then_restart_resumes(tmp_path, data_cache):
    """SIGKILL process 1 mid-run (after checkpoint 2 exists): process 0 exits non-zero
    within 60 s, naming process 1; a restart (here: 1 process) resumes from the last
    complete checkpoint."""
    ckpt = tmp_path / "ckpt"
    ov = tiny(tmp_path, data_cache, **{"train.steps": 10_000, "checkpoint.dir": str(ckpt),
                                       "checkpoint.every": 1, "checkpoint.keep": 2})
    heartbeat = 10
    with Group(tmp_path / "mp", "2,1,4", ov, heartbeat=heartbeat) as g:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not any(s >= 2 for s in steps_in(ckpt)):
            assert all(p.poll() is None for p in g.procs), "a process ended early:\n" + g.logs()
            assert time.monotonic() < deadline, "no checkpoint 2 in time:\n" + g.logs()
            time.sleep(0.2)
        g.procs[1].kill()
        t_kill = time.monotonic()
        try:
            rc0 = g.procs[0].wait(timeout=90)
        except subprocess.TimeoutExpired:
            raise AssertionError("process 0 still running 90 s after process 1 was killed:\n"
                                 + g.logs()) from None
        dt = time.monotonic() - t_kill
        log0 = g.log(0)
    print(f"\nprocess 0 stopped {dt:.1f} s after process 1 was killed (heartbeat timeout "
          f"{heartbeat} s), exit code {rc0}:\n"
          + "\n".join(line for line in log0.splitlines() if "ptdp-train:" in line))
    assert rc0 == DIST.EXIT_PEER_LOST, g.logs()
    assert dt < 60
    assert re.search(r"ptdp-train: process 0: lost process 1 of 2 on \S+ \(pid \d+\): no "
                     r"heartbeat for \d+ s", log0), log0
    # restart: resumes from the newest complete checkpoint
    last = steps_in(ckpt)[-1]
    assert last >= 2
    log = H.Log()
    res = train(mesh_shape=(2, 1, 4), log=log, overrides=dict(ov, **{"train.steps": last + 1}))
    assert res.start_step == last and len(res.losses) == 1 and np.isfinite(res.losses[0])
    assert f"resumed from {ckpt} at step {last}" in log.text


def test_a_signal_to_one_process_stops_both_at_one_step(tmp_path, data_cache):
    """SIGTERM to process 1 only, mid-run: both processes stop at the same step with one
    checkpoint, exit 0, and process 0 says why; a restart resumes at that step. The
    processes agree without waiting for the step in flight (Stopper: one step later)."""
    import signal
    ckpt = tmp_path / "ckpt"
    ov = tiny(tmp_path, data_cache, **{"train.steps": 10_000, "checkpoint.dir": str(ckpt),
                                       "checkpoint.every": 1, "checkpoint.keep": 100})
    with Group(tmp_path / "mp", "2,1,4", ov) as g:
        deadline = time.monotonic() + RUN_TIMEOUT
        while not any(s >= 2 for s in steps_in(ckpt)):
            assert all(p.poll() is None for p in g.procs), "a process ended early:\n" + g.logs()
            assert time.monotonic() < deadline, "no checkpoint 2 in time:\n" + g.logs()
            time.sleep(0.2)
        g.procs[1].send_signal(signal.SIGTERM)
        rcs = g.wait()
        r0, r1 = g.result(0), g.result(1)
        log0 = g.log(0)
    assert rcs == [0, 0], g.logs()
    n = len(r0["losses"])
    assert n == len(r1["losses"]) and n >= 2, (r0["losses"], r1["losses"])
    last = steps_in(ckpt)[-1]
    assert last == n                                  # the stop's checkpoint, at the same step
    assert re.search(rf"a stop request on another process at step {last}: checkpoint written",
                     log0), log0
    res = train(mesh_shape=(2, 1, 4), log=H.Log(), overrides=dict(ov, **{"train.steps": last + 1}))
    assert res.start_step == last and len(res.losses) == 1


def test_tensor_across_hosts_is_refused(tmp_path, data_cache):
    """parallel.tensor=8 on 2 processes of 4 devices: a ConfigError naming the numbers,
    on every process, before anything is compiled."""
    ov = tiny(tmp_path, data_cache, **{"model.num_heads": 8})
    with Group(tmp_path / "mp", "1,1,8", ov) as g:
        rcs = g.wait(120)
    assert all(rc != 0 for rc in rcs), g.logs()
    assert rcs[1] == 2, g.logs()
    assert ("ptdp-train: config error: parallel.tensor=8 would split tensor-parallel groups "
            "across hosts: each of the 2 processes has 4 devices, and parallel.tensor must "
            "divide 4") in g.log(1)
    assert "tuning.allow_cross_host_tensor=true" in g.log(1)


# ----------------------------------------------------------------------------- no processes

def test_mesh_layout_rules():
    """The in-host split: data first, then pipe; any valid (d, p) fits a host."""
    assert DIST._split_inside_host(2, 2, 2) == (2, 1)
    assert DIST._split_inside_host(2, 1, 1) == (1, 1)
    assert DIST._split_inside_host(2, 4, 4) == (2, 2)
    assert DIST._split_inside_host(3, 8, 4) == (1, 4)
    for d in range(1, 9):
        for p in range(1, 9):
            for r in (1, 2, 4, 8):
                if (d * p) % r == 0:
                    d_i, p_i = DIST._split_inside_host(d, p, r)
                    assert d_i * p_i == r and d % d_i == 0 and p % p_i == 0


def test_launch_arguments_are_checked(monkeypatch):
    for k in ("PTDP_COORDINATOR", "PTDP_NUM_PROCESSES", "PTDP_PROCESS_ID"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ConfigError, match="go together"):
        DIST.maybe_initialize("localhost:1234", 2, None)
    with pytest.raises(ConfigError, match=r"--process-id 2 must be in \[0, --num-processes 2\)"):
        DIST.maybe_initialize("localhost:1234", 2, 2)
    with pytest.raises(ConfigError, match="must be host:port"):
        DIST.maybe_initialize("localhost", 2, 0)
    assert DIST.maybe_initialize("localhost:1234", 1, 0) is False       # one process: nothing
    assert DIST.maybe_initialize() is False                              # no cluster here
    # backends are up in this process: a multi-process setup now is a clear error
    jax.devices()
    monkeypatch.setenv("PTDP_COORDINATOR", "localhost:1234")
    monkeypatch.setenv("PTDP_NUM_PROCESSES", "2")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "1")
    with pytest.raises(ConfigError, match="jax.distributed must start first"):
        DIST.maybe_initialize()


def _clear_launch_env(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("SLURM_", "OMPI_", "PTDP_", "JAX_COORDINATOR", "JAX_LOCAL_DEVICE")) or \
                k in ("JOB_COMPLETION_INDEX", "KUBERNETES_SERVICE_HOST"):
            monkeypatch.delenv(k)


def test_launch_from_environment(monkeypatch):
    """What each launcher's environment turns into (nothing is initialised here)."""
    _clear_launch_env(monkeypatch)
    assert DIST._explicit_setup(None, None, None) is None
    assert DIST._cluster_setup(300) is None                      # a plain process
    # Kubernetes Indexed Job with PTDP_* variables (the README's example)
    monkeypatch.setenv("PTDP_COORDINATOR", "train-0.train:1234")
    monkeypatch.setenv("PTDP_NUM_PROCESSES", "4")
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "3")
    assert DIST._explicit_setup(None, None, None) == DIST.ProcessSetup(
        "train-0.train:1234", 4, 3, "explicit")
    assert DIST._explicit_setup("h:1", 2, 0).coordinator == "h:1"    # arguments first
    _clear_launch_env(monkeypatch)
    # srun, one task per node: all of the node's devices
    for k, v in {"SLURM_JOB_ID": "4242", "SLURM_STEP_NODELIST": "gpu[007-008]", "SLURM_NTASKS": "2",
                 "SLURM_PROCID": "1", "SLURM_LOCALID": "0", "SLURM_STEP_NUM_NODES": "2"}.items():
        monkeypatch.setenv(k, v)
    s = DIST._cluster_setup(300)
    assert (s.coordinator.split(":")[0], s.num_processes, s.process_id, s.source,
            s.local_device_ids) == ("gpu007", 2, 1, "slurm", None)
    # srun, 2 tasks per node: JAX's default of one device per process
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert DIST._cluster_setup(300).local_device_ids == (0,)
    monkeypatch.setenv("SLURM_NTASKS", "1")                       # srun -n 1: single process
    assert DIST._cluster_setup(300) is None
    _clear_launch_env(monkeypatch)
    # mpirun, one rank per host
    for k, v in {"OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1,10.148.0.1:34911",
                 "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
                 "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}.items():
        monkeypatch.setenv(k, v)
    s = DIST._cluster_setup(300)
    assert (s.coordinator.split(":")[0], s.num_processes, s.process_id, s.source,
            s.local_device_ids) == ("10.96.0.1", 2, 0, "ompi", None)
