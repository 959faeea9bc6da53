"""Running, stopping, extending and reading a run: nothing-to-train said aloud, metrics.jsonl
shared by runs and resumes without duplicates, messages above the bar and the validation loss
that stays, Ctrl-C without a checkpoint dir, forward-only evaluation, parameters gathered only
when asked, train.stop_at_step / stop_after_minutes / decay_steps, the loss averaged over the
log interval, the resolved config in run.dir, ptdp-eval and ptdp-generate."""
import importlib
import json
import math
import signal
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import helpers_ckpt as H
from ptdp_jax.checkpoint import manager as CK
from ptdp_jax.config import decisions as D
from ptdp_jax.cli.train import main as cli_main
from ptdp_jax.config.load import load_config
from ptdp_jax.exits import ExitCode
from ptdp_jax.run.loop import resolve_config, train

T = importlib.import_module("ptdp_jax.run.loop")
pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")


def small(tmp_path, data_cache, **extra):
    return H.tiny(tmp_path, data_cache, **{"model.num_layers": 2, "train.steps": 4, **extra})


def metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (Path(tmp_path) / "run" / "metrics.jsonl")
            .read_text().splitlines()]


# ------------------------------------------------------------------- nothing to train

def test_resuming_past_train_steps_says_nothing_to_train(tmp_path, data_cache, monkeypatch):
    ov = small(tmp_path, data_cache, **{"train.steps": 2})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    n_lines = len(metrics(tmp_path))
    log = H.Log()

    def no_compile(*args, **kwargs):
        raise AssertionError("compiled a step with nothing to train")
    monkeypatch.setattr(T, "_compile_steps", no_compile)
    res = train(mesh_shape=(1, 1, 1), overrides={**ov, "train.steps": 1, "train.sample_tokens": 8},
                log=log)
    assert res.losses == [] and res.start_step == 2 and res.sample is None
    assert "nothing to train: the checkpoint in" in log.text and "at step 2 and train.steps=1" in log.text
    assert "train.decay_steps=2" in log.text
    assert "sample" not in log.text and "done:" not in log.text
    assert len(metrics(tmp_path)) == n_lines


# ---------------------------------------------------------------- metrics across runs

def test_metrics_shared_by_runs_and_resumes(tmp_path, data_cache):
    """Two fresh runs in one run.dir: both kept, each line with its run id. A run resumed
    from step 2 after it had logged step 3 (its checkpoint 3 lost) logs 3 and 4 again:
    the stale line goes, no (run, step) twice."""
    ov = small(tmp_path, data_cache, **{"train.steps": 3, "checkpoint.every": 2,
                                        "checkpoint.keep": 5, "checkpoint.dir": ""})
    a = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    b = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    lines = metrics(tmp_path)
    assert a.run_id != b.run_id
    assert [(m["run"], m["step"]) for m in lines] == \
        [(a.run_id, 1), (a.run_id, 2), (a.run_id, 3), (b.run_id, 1), (b.run_id, 2), (b.run_id, 3)]
    # resume: run c writes checkpoints 2 and 3; checkpoint 3 is lost; c goes on from 2 to 4
    ck = {**ov, "checkpoint.dir": str(tmp_path / "ckpt")}
    c = train(mesh_shape=(1, 1, 1), overrides=ck, log=H.Log())
    import shutil
    shutil.rmtree(tmp_path / "ckpt" / "3")
    c2 = train(mesh_shape=(1, 1, 1), overrides={**ck, "train.steps": 4}, log=H.Log())
    assert c2.start_step == 2 and c2.run_id == c.run_id
    lines = metrics(tmp_path)
    pairs = [(m["run"], m["step"]) for m in lines]
    assert len(pairs) == len(set(pairs))
    assert [s for r, s in pairs if r == c.run_id] == [1, 2, 3, 4]
    assert [s for r, s in pairs if r in (a.run_id, b.run_id)] == [1, 2, 3] * 2
    third = next(m for m in lines if m["run"] == c.run_id and m["step"] == 3)
    assert third["loss"] == c2.losses[0]                 # the new step 3, not the stale one


def test_resolved_config_saved_in_run_dir(tmp_path, data_cache):
    res = train(mesh_shape=(1, 1, 1), overrides=small(tmp_path, data_cache, **{"train.steps": 1}),
                log=H.Log())
    saved = tmp_path / "run" / f"config-{res.run_id}.yaml"
    assert load_config(saved) == res.config


# ---------------------------------------------------------- validation loss on screen

def test_validation_loss_logged_without_a_bar_and_kept_on_it(tmp_path, data_cache, monkeypatch):
    log = H.Log()
    res = train(mesh_shape=(1, 1, 1), log=log, overrides=small(
        tmp_path, data_cache, **{"train.eval_every": 2, "checkpoint.dir": ""}))
    v2 = dict(res.val_losses)[2]
    assert f"step 2/4 val loss {v2:.4f} (perplexity {math.exp(v2):.2f})" in log.text
    # with a bar: messages go through the bar's write, the val loss stays on it
    from ptdp_jax.run.runlog import RunLog
    cfg = resolve_config(None, (1, 1, 1), small(tmp_path, data_cache))
    monkeypatch.setattr(D, "progress_bar", lambda stream=None: True)     # as on a terminal
    lines = []
    rl = RunLog(cfg, lines.append, 0, "test-run")
    written = []
    rl.bar.write = written.append
    out = {"loss": 3.0, "grad_norm": 1.0, "finite": True}
    rl.step(1, out, 0.1, 1e-3, val_loss=2.5)
    rl.message("received SIGTERM at step 1")
    rl.step(2, out, 0.1, 1e-3)
    assert "val=2.5000@1" in str(rl.bar.postfix)
    assert written == ["received SIGTERM at step 1"] and lines == []
    rl.close()


def test_one_loss_window_on_screen_in_the_metrics_and_on_the_done_line(tmp_path):
    """train.log_every=2: each metrics line holds the mean of the steps since the line before
    (an evaluation closes one early), the screen shows the latest line's, and the done line
    the first line's and the last's, with the step of the val loss."""
    import json
    from ptdp_jax.run.runlog import RunLog
    cfg = load_config(overrides={"run.dir": str(tmp_path), "train.log_every": 2,
                                 "train.steps": 5})
    lines = []
    rl = RunLog(cfg, lines.append, 0, "test-run")
    for step, loss in enumerate([8.0, 6.0, 5.0, 3.0, 2.0], start=1):
        rl.step(step, {"loss": loss, "grad_norm": 1.0, "finite": True}, 0.1, 1e-3,
                val_loss=1.5 if step == 3 else None, took={"eval_s": 0.5} if step == 3 else None)
    rl.done([8.0, 6.0, 5.0, 3.0, 2.0], stopped="received SIGTERM")
    rl.close()
    rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
    assert [(r["step"], r["loss"]) for r in rows] == [(2, 7.0), (3, 5.0), (4, 3.0), (5, 2.0)]
    assert rows[1]["eval_s"] == 0.5 and "eval_s" not in rows[0]
    assert lines[0].startswith("step 1/5 loss 8.0000")           # no line closed yet: the step's
    assert lines[-1] == ("done: 5 steps, loss 7.0000 at step 2 -> 2.0000 at step 5 (means of "
                         "train.log_every=2 steps), val 1.5000 (at step 3); stopped at step 5 "
                         "(received SIGTERM)")


def test_ctrl_c_without_a_checkpoint_dir_stops_cleanly(tmp_path, data_cache):
    log = H.Log(at=1, sig=signal.SIGINT)
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    res = train(mesh_shape=(1, 1, 1), log=log, overrides=small(
        tmp_path, data_cache, **{"train.steps": 50, "checkpoint.dir": "",
                                 "train.sample_tokens": 8}))
    assert res.stopped_by_signal and len(res.losses) == 1
    assert "received SIGINT at step 1: no checkpoint.dir, so no checkpoint; exiting" in log.text
    assert "stopped at step 1 (received SIGINT)" in log.text
    assert res.sample is None and "sample" not in log.text      # no sample after a stop
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_second_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    """A second Ctrl-C, or one that interrupts XLA before training starts (the step's or the
    state's compile), ends ptdp-train through exits.leave_now(130) after one line: the
    interpreter's teardown after an interrupted compile can crash (exit 139)."""
    import ptdp_jax.cli.train as C

    def interrupted(*a, **k):
        raise KeyboardInterrupt
    left = []
    monkeypatch.setattr(T, "train", interrupted)
    monkeypatch.setattr(C, "leave_now", lambda code, message="": left.append(code))
    assert cli_main(["train.steps=1"]) == ExitCode.INTERRUPTED == 130
    assert left == [130]
    err = capsys.readouterr().err
    assert err.strip() == ("ptdp-train: interrupted (a second Ctrl-C, or one before training "
                           "started): stopped at once; a resume starts from the newest "
                           "complete checkpoint")


def test_leave_now_flushes_and_exits_with_its_code():
    import subprocess
    import sys
    code = "from ptdp_jax.exits import leave_now; print('kept', end=''); leave_now(130, 'why')"
    r = subprocess.run([sys.executable, "-c", code], cwd=H.REPO, env=H.subprocess_env(),
                       capture_output=True, text=True, timeout=120)
    assert (r.returncode, r.stdout, r.stderr.strip()) == (130, "kept", "why")


def test_two_ctrl_c_interrupt_train_at_once(tmp_path, data_cache):
    class Twice(H.Log):
        def __call__(self, *a, **k):
            super().__call__(*a, **k)
            if self.lines[-1].startswith("step 1/"):
                import os
                os.kill(os.getpid(), signal.SIGINT)
                os.kill(os.getpid(), signal.SIGINT)
    handlers = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt):
        train(mesh_shape=(1, 1, 1), log=Twice(), overrides=small(
            tmp_path, data_cache, **{"train.steps": 50}))
    assert signal.getsignal(signal.SIGINT) == handlers
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


# ------------------------------------------------------------------- evaluation on every layout

@pytest.mark.parametrize("mesh,extra", [
    ((1, 1, 1), {}),
    ((2, 1, 2), {}),
    ((1, 2, 2), {"parallel.schedule": "1f1b"}),
    ((2, 2, 2), {"parallel.schedule": "interleaved", "parallel.virtual_stages": 2}),
    ((1, 2, 1), {"parallel.schedule": "1f1b", "parallel.stage_layers": [3, 1]}),
    ((1, 4, 1), {"parallel.schedule": "gpipe", "model.arch": "llama",
                 "model.ffn_hidden_size": 64, "model.num_kv_heads": 2}),
    ((1, 2, 2), {"parallel.schedule": "zb-v", "parallel.virtual_stages": 2,
                 "model.num_layers": 5, "parallel.stage_layers": [1, 2, 1, 1]}),
], ids=["1x1x1", "2x1x2", "1x2x2", "2x2x2-interleaved", "1x2x1-layers31", "llama-1x4x1-gqa",
        "1x2x2-zb-v"])
def test_evaluation_is_the_forward_loss_without_dropout(mesh, extra):
    """The validation loss is the model's forward loss with dropout off, on any layout:
    equal to the one-device forward of the same parameters (model.dropout=0.5 or not)."""
    from ptdp_jax.training.evaluate import make_eval_fn
    from ptdp_jax.models import model as M
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import make_optimizer, state_shardings, stage_params
    ov = {"model.num_layers": 4, "model.hidden_size": 32, "model.num_heads": 4,
          "model.seq_len": 16, "train.global_batch_size": 8, "train.micro_batch_size": 2,
          **extra}
    cfg = resolve_config(None, mesh, {**ov, "model.dropout": 0.5})
    params = M.init_params(cfg.model, 3)
    batch = np.random.default_rng(0).integers(0, 257, (8, 17)).astype(np.int32)
    want = float(M.loss_sum(cfg.model, jax.tree.map(jnp.asarray, params), batch[:, :-1],
                            batch[:, 1:])) / (8 * 16)
    m = make_mesh(mesh)
    sh = state_shardings(cfg, m, make_optimizer(cfg)[0])["params"]
    stage = jax.jit(lambda p: stage_params(cfg, p), out_shardings=sh)(params)
    got = float(jax.jit(make_eval_fn(cfg, m))(stage, batch))
    np.testing.assert_allclose(got, want, rtol=2e-6)
    assert 4.0 < got < 7.0


# ----------------------------------------------------------------- parameters gathered

def test_parameters_gathered_only_when_asked(tmp_path, data_cache, monkeypatch):
    gathered = []
    orig = T.to_host
    monkeypatch.setattr(T, "to_host", lambda *a, **k: gathered.append(k) or orig(*a, **k))
    ov = small(tmp_path, data_cache, **{"train.steps": 1, "checkpoint.dir": ""})
    res = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log(), return_params=False)
    assert res.params is None and gathered == []
    res = train(mesh_shape=(1, 1, 1), overrides={**ov, "train.sample_tokens": 4}, log=H.Log(),
                return_params=False)
    assert res.params is None and res.sample and gathered                # one array at a time
    assert all(k == {"only_process0": True} for k in gathered)


# ----------------------------------------------------------------------------- stop, extend

def test_lr_schedule_first_step_decay_steps_and_extension():
    from ptdp_jax.training.state import lr_schedule
    cfg = load_config(overrides={"train.lr": 1.0, "train.warmup_steps": 4, "train.steps": 10,
                                 "train.min_lr_ratio": 0.1})
    lr = lr_schedule(cfg)
    assert float(lr(0)) == pytest.approx(0.25)                 # not 0
    assert float(lr(3)) == pytest.approx(1.0)                  # the warm-up's last step
    assert float(lr(9)) == pytest.approx(0.1)                  # the decay's last step
    longer = load_config(overrides={"train.lr": 1.0, "train.warmup_steps": 4, "train.steps": 20,
                                    "train.min_lr_ratio": 0.1, "train.decay_steps": 10})
    lr2 = lr_schedule(longer)
    assert all(float(lr2(k)) == float(lr(k)) for k in range(10))   # same schedule
    assert float(lr2(15)) == pytest.approx(0.1)                     # and flat after it


def test_stop_at_step_then_resume_matches_one_run(tmp_path, data_cache):
    """train.stop_at_step=2 of 4: a checkpoint and a clean stop; resuming without it
    continues to 4 with exactly the losses of an uninterrupted run (the schedule does
    not depend on where the run stopped)."""
    ov = small(tmp_path, data_cache)
    base = train(mesh_shape=(1, 1, 1), overrides={**ov, "checkpoint.dir": ""}, log=H.Log())
    log = H.Log()
    first = train(mesh_shape=(1, 1, 1), overrides={**ov, "train.stop_at_step": 2,
                                                   "train.sample_tokens": 4}, log=log)
    assert len(first.losses) == 2 and first.stopped == "train.stop_at_step=2"
    assert "train.stop_at_step=2 at step 2: checkpoint written to" in log.text
    assert first.sample is None
    assert CK.read_meta(tmp_path / "ckpt" / "2")["step"] == 2
    second = train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    assert second.start_step == 2 and first.losses + second.losses == base.losses
    assert [m["lr"] for m in metrics(tmp_path)][-4:] == [m["lr"] for m in metrics(tmp_path)][:4]


def test_stop_after_minutes(tmp_path, data_cache):
    log = H.Log()
    res = train(mesh_shape=(1, 1, 1), log=log, overrides=small(
        tmp_path, data_cache, **{"train.steps": 50, "train.stop_after_minutes": 1e-6}))
    assert len(res.losses) == 1 and res.stopped.startswith("train.stop_after_minutes=1e-06")
    assert CK.read_meta(tmp_path / "ckpt" / "1")["step"] == 1


def test_extend_a_finished_run_keeps_its_schedule(tmp_path, data_cache):
    ov = small(tmp_path, data_cache, **{"train.steps": 2, "train.warmup_steps": 1,
                                        "train.lr": 1e-2, "train.min_lr_ratio": 0.1})
    train(mesh_shape=(1, 1, 1), overrides=ov, log=H.Log())
    res = train(mesh_shape=(1, 1, 1), overrides={**ov, "train.steps": 4, "train.decay_steps": 2},
                log=H.Log())
    assert res.start_step == 2 and len(res.losses) == 2
    assert [m["lr"] for m in metrics(tmp_path)][2:] == pytest.approx([1e-3, 1e-3])


def test_the_loop_reads_a_step_while_the_next_runs(tmp_path, data_cache, monkeypatch):
    """Step n + 1 is dispatched before step n's metrics are read, except where something needs
    step n's state (the checkpoint of step 3, the evaluation at step 4, the last step)."""
    events = []
    compile_step, read = T._compile_step, T._read

    def spy_compile(*a, **k):
        exe = compile_step(*a, **k)

        def dispatch(state, batch):
            events.append("dispatch")
            return exe(state, batch)
        return dispatch

    def spy_read(pending, last_ready):
        events.append(f"read {pending[0]}")
        return read(pending, last_ready)

    monkeypatch.setattr(T, "_compile_step", spy_compile)
    monkeypatch.setattr(T, "_read", spy_read)
    ov = small(tmp_path, data_cache, **{"train.steps": 6, "checkpoint.every": 3,
                                        "train.eval_every": 4})
    ahead = train(mesh_shape=(1, 1, 1), log=H.Log(), overrides=ov)
    assert events == ["dispatch", "dispatch", "read 1", "dispatch", "read 2", "read 3",
                      "dispatch", "read 4", "dispatch", "dispatch", "read 5", "read 6"]
    assert [s for s, _ in ahead.val_losses] == [4, 6]


# ----------------------------------------------------------------------------- logging

def test_logged_loss_is_the_mean_over_the_interval(tmp_path, data_cache):
    res = train(mesh_shape=(1, 1, 1), log=H.Log(), overrides=small(
        tmp_path, data_cache, **{"train.log_every": 2, "checkpoint.dir": ""}))
    lines = metrics(tmp_path)
    assert [m["step"] for m in lines] == [2, 4]
    assert lines[0]["loss"] == pytest.approx(np.mean(res.losses[:2]), rel=1e-12)
    assert lines[1]["loss"] == pytest.approx(np.mean(res.losses[2:]), rel=1e-12)


def test_peak_memory_from_devices_that_report_it():
    from ptdp_jax.run.runlog import peak_memory_gib

    class Dev:
        def __init__(self, stats):
            self.stats = stats

        def memory_stats(self):
            return self.stats
    assert peak_memory_gib([Dev({"peak_bytes_in_use": 2**30}), Dev({"peak_bytes_in_use": 3 * 2**30})]) == 3.0
    assert peak_memory_gib([Dev(None)]) is None


# ----------------------------------------------------------------------------- eval, generate

@pytest.fixture(scope="module")
def trained(tmp_path_factory, data_cache):
    d = tmp_path_factory.mktemp("trained")
    ov = small(d, data_cache, **{"train.steps": 3, "train.eval_batches": 2,
                                 "model.dropout": 0.2})
    res = train(mesh_shape=(1, 2, 1), overrides=ov, log=H.Log(), return_params=True)
    return d, ov, res


def test_ptdp_eval_matches_the_runs_validation_loss(trained, capsys):
    from ptdp_jax.run import evaluate as EV
    from ptdp_jax.cli import eval as eval_cli
    d, ov, res = trained
    step, val = res.val_losses[-1]
    assert eval_cli.main([str(d / "ckpt"), "--mesh", "1,1,2"]) == 0
    out = capsys.readouterr().out
    loss = float(out.split("val loss ")[1].split(",")[0])
    assert abs(loss - val) < 1e-4 and f"step {step}:" in out
    ppl = float(out.split("perplexity ")[1].split()[0])
    assert ppl == pytest.approx(math.exp(val), abs=0.01 + 1e-4 * math.exp(val))
    got = EV.evaluate_checkpoint(d / "ckpt", mesh="1,2,1")
    assert got["loss"] == pytest.approx(val, rel=1e-5)
    assert eval_cli.main([str(d / "ckpt"), "model.hidden_size=64"]) == ExitCode.CONFIG
    assert eval_cli.main([str(d / "nothing")]) == ExitCode.CHECKPOINT


def test_ptdp_generate(trained, capsys):
    from ptdp_jax.run import generate as G
    from ptdp_jax.cli import generate as generate_cli
    from ptdp_jax.data import ByteTokenizer
    d, ov, res = trained
    assert generate_cli.main([str(d / "ckpt"), "--prompt", "The ", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out.rstrip("\n")
    cfg = resolve_config(None, None, ov)
    greedy = G.generate(cfg.model, res.params, ByteTokenizer().encode("The "), 12)
    assert out == "The " + ByteTokenizer().decode(greedy)
    sampled = [G.generate(cfg.model, res.params, [84], 12, temperature=1.0, top_k=5, seed=s)
               for s in (0, 0, 1)]
    assert sampled[0] == sampled[1] and sampled[0] != greedy
    assert G.generate(cfg.model, res.params, ByteTokenizer().encode("The "), 12,
                      temperature=0.7, top_k=1) == greedy
    assert generate_cli.main([str(d / "ckpt"), "--prompt", "x", "--temperature", "-1"]) == ExitCode.CONFIG


def test_processes_agree_on_a_stop_one_check_later(monkeypatch):
    """Several processes: each check dispatches an agreement and reads only the one of the
    check before (so it never waits for the step in flight); a stop agreed at check k is
    taken at check k + 1, on every process, signal or not."""
    from ptdp_jax.parallel import cross_process as cross_process
    from ptdp_jax.parallel.stopping import Stopper

    other = {3}                          # the checks at which the other process has a signal
    made = []                            # per agreement: [this process's flag, read yet?]

    def later(flag):
        i = len(made)
        made.append([flag, False])

        def read():
            made[i][1] = True
            return flag or (i + 1) in other
        return read

    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(cross_process, "any_process_later", later)
    stopper = Stopper(load_config())
    try:
        for k in (1, 2, 3):
            assert stopper.check(k) is None
            assert made[-1][1] is False  # this check's agreement is not read by this check
        assert stopper.check(4) == "a stop request on another process"
        assert [f for f, _ in made] == [False] * 4 and not stopper.by_signal

        other.clear()
        stopper.guard.requested, stopper.guard.name = True, "SIGTERM"     # this process's
        assert stopper.check(5) is None                          # agreed at the next check
        assert stopper.check(6) == "received SIGTERM" and stopper.by_signal
    finally:
        stopper.restore()


def test_a_step_ends_when_its_outputs_are_ready_not_when_the_loop_looks():
    """The loop's thread can be held in the next step's dispatch (a GPU's full launch queue)
    while the step before ends: the clock's thread notes the end when it happens."""
    import threading
    import time
    from ptdp_jax.run.clock import StepClock

    done = threading.Event()

    class Out:                        # stands for a step's outputs, ready once `done` is set
        def block_until_ready(self):
            done.wait()
            return self

    clock = StepClock()
    t0 = time.perf_counter()
    ends = clock.track(Out())
    threading.Timer(0.1, done.set).start()
    time.sleep(0.6)                   # the loop busy elsewhere (dispatching the next step)
    end = ends.result()
    clock.close()
    assert 0.08 < end - t0 < 0.4
