"""`train()`: the Python API behind `ptdp-train`.

    from ptdp_jax import train
    result = train("configs/demo.yaml", mesh_shape=(2, 2, 2), overrides={"train.steps": 50})
    result.losses          # one float per step
    result.params          # canonical host numpy arrays (independent of mesh and schedule)

The loop is a table of contents; each line is one call into its own module: the data
(feed.py), the step (step.py), the log (runlog.py), the evaluation (evaluate.py), the
checkpoint (checkpoint.py) and the stop conditions (stopping.py).

Before compiling, the config's `auto` values and its layout are resolved for the devices at
hand (resolve.py; on GPUs a config without a mesh, or one written for more devices, runs the
planner's layout, said in one line with its predicted step time and memory).

The loop dispatches step n + 1 before it reads step n's metrics, so the
host's work between steps (logging, the next batch, the dispatch itself) runs while the devices
compute. It waits for a step before anything that needs its state: an evaluation, a checkpoint,
a stop, the last step. A signal therefore ends the run after the step in flight, which may be
one step after the last one logged (several processes: one step later still, as they agree on
it without waiting; stopping.Stopper); train.stop_at_step and checkpoint.every stay exact.
"""
from __future__ import annotations

import time
from functools import partial
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import jax

from ptdp_jax.checkpoint import lock as LK, manager as CK, start as ST, weights as LW
from ptdp_jax.training import preflight as preflight
from ptdp_jax.training.compile_cache import use_compile_cache
from ptdp_jax.config import decisions as D
from ptdp_jax.config.load import Config, ConfigError, load_with_keys, migrate
from ptdp_jax.run.resolve import for_devices
from ptdp_jax.config.validation import check_devices, check_directories
from ptdp_jax.parallel.cross_process import to_host
from ptdp_jax.parallel.distributed import maybe_initialize
from ptdp_jax.training.evaluate import evaluate
from ptdp_jax.run.clock import StepClock
from ptdp_jax.run.feed import Feed
from ptdp_jax.run.phases import DeviceMemoryError, phase
from ptdp_jax.training.metrics import check_wandb
from ptdp_jax.run.runlog import RunLog, new_run_id
from ptdp_jax.run.steps import Steps
from ptdp_jax.parallel.sharding import make_mesh
from ptdp_jax.checkpoint import saving as SV
from ptdp_jax.training.state import make_optimizer
from ptdp_jax.training.step import compile_all
from ptdp_jax.parallel.stopping import Stopper


class TrainingStopped(RuntimeError):
    """The run stopped early (too many non-finite steps); the message says why."""


@dataclass
class TrainResult:
    losses: list[float]
    params: Any                                  # canonical numpy pytree (None unless asked)
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    sample: str | None = None
    config: Config | None = None
    start_step: int = 0                          # > 0 when resumed from a checkpoint
    bad_steps: int = 0                           # updates skipped for non-finite values
    step_times: list[float] = field(default_factory=list)
    stopped_by_signal: bool = False
    stopped: str | None = None                   # why the run stopped before train.steps
    run_id: str = ""
    layout: str = ""                             # where the layout came from (resolve.Run.note)
    predicted_step_s: float | None = None        # the planner's prediction of it (GPUs)
    attention_share: float = 1.0                 # document masking's, of the causal pairs (MFU)


def resolve_config(config=None, mesh_shape=None, overrides: Mapping[str, Any] | None = None) -> Config:
    """The config as loaded, with mesh_shape (nothing resolved for the devices yet)."""
    return _load(config, mesh_shape, overrides)[0]


def resolved_config(config=None, mesh_shape=None,
                    overrides: Mapping[str, Any] | None = None) -> Config:
    """The config as train() would run it on this process's devices: dtype, layout and
    recomputation resolved, validated (ConfigError naming the key); nothing compiled."""
    return _for_devices(_load(config, mesh_shape, overrides), _quiet).config


def _load(config, mesh_shape, overrides):
    """(Config, the keys the file or the command line set, those of the command line: the
    overrides and mesh_shape)."""
    cfg, explicit = load_with_keys(config, overrides)
    given = {k: v for k, v in migrate(dict(overrides or {}), strict=False)[0].items()
             if v is not None}                              # a null unsets its key
    command_line = set(given)
    if mesh_shape is not None:
        if len(tuple(mesh_shape)) != 3 or any(int(a) < 1 for a in mesh_shape):
            raise ConfigError(f"mesh_shape must be three positive ints (data, pipe, tensor), "
                              f"got {tuple(mesh_shape)}")
        d, p, t = (int(a) for a in mesh_shape)
        for key, size in zip(D.MESH_KEYS, (d, p, t)):
            if key in given and getattr(cfg.parallel, key.split(".")[1]) != size:
                raise ConfigError(f"the mesh ({d}, {p}, {t}) sets {key}={size}, and the "
                                  f"overrides set {key}={given[key]}: give one of them")
        cfg = replace(cfg, parallel=replace(cfg.parallel, data=d, pipe=p, tensor=t))
        command_line |= set(D.MESH_KEYS)
    return cfg, set(explicit) | command_line, command_line


def _quiet(*args, **kwargs):
    pass


def _for_devices(loaded, log):
    """The loaded config resolved for jax's devices (resolve.for_devices), validated."""
    cfg, explicit, command_line = loaded
    return for_devices(cfg, explicit, command_line, jax.devices(), log, jax.local_device_count())


@LK.released_on_return                 # checkpoint.dir's lock, taken in _setup
def train(config=None, *, mesh_shape=None, overrides: Mapping[str, Any] | None = None,
          log=print, distributed: Mapping[str, Any] | None = None,
          return_params: bool = True) -> TrainResult:
    """Train a model; see the module docstring. `config` is a YAML path or a Config
    (None: defaults); `mesh_shape` (data, pipe, tensor) uses the first d*p*t devices.
    `distributed`: keyword arguments of ptdp_jax.parallel.distributed.maybe_initialize
    (coordinator, num_processes, process_id, ...); without it a multi-process run is
    still started from PTDP_* variables or the cluster's environment.
    `return_params`: gather the final parameters into result.params (on process 0
    only; other processes get None); ptdp-train passes False."""
    loaded = _load(config, mesh_shape, overrides)
    maybe_initialize(**dict(distributed or {}))
    is_main = jax.process_index() == 0
    log = log if is_main else _quiet
    run = _for_devices(loaded, log)                          # dtype, layout, recompute
    cfg = run.config
    setup = _setup(cfg)
    nothing = _nothing_to_train(cfg, setup.start)             # before minutes of compiling
    train_step = None if nothing else _compile_steps(cfg, setup, log)
    feed, compiled, lr, replaced = setup.feed, setup.compiled, setup.lr, setup.replaced
    with phase("restore", setup.start, cfg):
        state, start, run_id, ckpt = _restore_or_init(cfg, compiled, setup.weights, log)
    runlog = RunLog(cfg, log, start, run_id, enabled=is_main,
                    attention_share=run.attention_share)
    stopper = Stopper(cfg)                 # from here a signal ends the run cleanly
    runlog.header()
    if replaced:
        runlog.message(CK.replaced_message(cfg, replaced))
    result = TrainResult(losses=[], params=None, config=cfg, start_step=start, run_id=run_id,
                         layout=run.note, predicted_step_s=run.predicted_step_s,
                         attention_share=run.attention_share)
    end = cfg.train.steps
    if nothing:
        runlog.message(nothing)
        end = start
    lr_of = _host_lr(lr)
    pending, ready = None, None       # a step dispatched and not yet read; when the last was read

    clock = StepClock()

    def record(evaluate_now=False, save=False):   # read, evaluate, save, log the pending step
        nonlocal pending, ready
        with phase("train", pending[0], cfg, run_id):
            n, metrics, seconds, ready = _read(pending, ready)
        train_step.saw(metrics)
        pending = None
        _account(result, metrics, seconds, runlog, n, cfg, ckpt)
        val, took = _evaluate_and_save(cfg, n, state, setup, ckpt, result, evaluate_now, save)
        if took:
            ready = None                  # the next step's time starts at its dispatch
        runlog.step(n, metrics, seconds, lr_of(n - 1), val, took)           # log

    oom = None
    try:
        for step in range(start, end):
            batch = feed.batch(step)                                         # data
            t0 = time.perf_counter()
            with phase("train", step + 1, cfg, run_id):
                state, out = train_step(state, batch)                        # step (asynchronous)
            if pending is not None:       # the step before, logged while this one runs
                record()
            pending = (step + 1, out, t0, clock.track(out))
            why = stopper.check(step + 1)                                    # stop?
            save = ckpt is not None and bool(why or ckpt.due(step + 1))
            evaluate_now = _eval_due(cfg, step + 1)
            if not (why or save or evaluate_now or step + 1 == end):
                continue                  # nothing needs this step's state: dispatch on
            record(evaluate_now, save)    # waits for the step
            if why:
                result.stopped, result.stopped_by_signal = why, stopper.by_signal
                runlog.message(_stopped(why, step + 1, ckpt))
                break
    except DeviceMemoryError as e:
        oom = e
    finally:
        clock.close()
        runlog.close()
        try:
            if ckpt is not None:
                ckpt.close()              # waits for the last save; raises if it failed
        finally:
            stopper.restore()
    if oom is not None:                   # said once the saves in flight are complete
        raise DeviceMemoryError(f"{oom}; {ckpt.survivor() if ckpt else 'no checkpoint.dir'}")

    _finish(cfg, result, state, feed, runlog, return_params, is_main, log)
    return result


# ----------------------------------------------------------------------------- the pieces

def _evaluate_and_save(cfg, n, state, setup, ckpt, result, evaluate_now, save):
    """After step n: the evaluation and the checkpoint it is due, each timed apart from the
    step; (validation loss or None, {'eval_s', 'checkpoint_s'} of what ran)."""
    val, took = None, {}
    if evaluate_now:                                                         # eval
        t = time.perf_counter()
        with phase("eval", n, cfg, result.run_id):
            val = evaluate(setup.compiled.eval_loss, state.params, setup.feed.val_batch,
                           cfg.train.eval_batches)
        took["eval_s"] = time.perf_counter() - t
        result.val_losses.append((n, val))
    if save:                                                                 # checkpoint
        t = time.perf_counter()
        with phase("checkpoint", n, cfg, result.run_id):
            ckpt.save(n, state)
        took["checkpoint_s"] = time.perf_counter() - t
    return val, took


def _stopped(why: str, n: int, ckpt) -> str:
    """The line of a run stopped early, said once its checkpoint is written."""
    if ckpt is None:
        return f"{why} at step {n}: no checkpoint.dir, so no checkpoint; exiting"
    ckpt.wait()
    return f"{why} at step {n}: checkpoint written to {ckpt.directory / str(n)}, exiting"


@dataclass
class _Setup:
    feed: Feed
    estimate: Any                # preflight's memory estimate (None where it has none)
    replaced: list[int]          # checkpoints this run removes at its first save
    tx: Any                      # the optimizer and its learning-rate schedule
    lr: Any
    compiled: Any                # step.Compiled: jitted, not compiled yet
    cache: str | None            # the compilation cache in use
    start: int                   # the step the run resumes from (0: a fresh start)
    weights: Any = None          # checkpoint.load_weights's source, checked (or None)


def _setup(cfg) -> _Setup:
    """What train() and dry_run() do before compiling the step: what can refuse the run
    (FP8 or cuDNN on these devices, run.dir, W&B, the data, the memory estimate,
    checkpoint.dir and its lock), then the mesh, the optimizer and the jitted step."""
    check_devices(cfg, jax.devices())                        # FP8, cuDNN
    check_directories(cfg)                                   # run.dir, run.compile_cache
    cache = use_compile_cache(cfg.run.compile_cache)         # before the first compile
    check_wandb(cfg.run.wandb_project)                       # installed, if asked for
    feed = Feed(cfg)                                         # opens and checks the data
    estimate = preflight.check_memory(cfg)                   # the estimate against a device
    LK.lock_checkpoint_dir(cfg)                              # one run a checkpoint.dir
    replaced = CK.check_checkpoint_dir(cfg)                  # before compiling; never drops
                                                             # checkpoints unasked
    start = CK.resume_step(cfg)
    weights = LW.check_load_weights(cfg)                     # unless the run resumes
    mesh = make_mesh(cfg.parallel.mesh_dims,
                     allow_cross_host_tensor=cfg.tuning.allow_cross_host_tensor)
    feed.use_mesh(mesh)
    tx, lr = make_optimizer(cfg)
    return _Setup(feed, estimate, replaced, tx, lr, compile_all(cfg, mesh, tx), cache, start,
                  weights)


def _compile_steps(cfg, run: _Setup, log) -> Steps:
    """The train step compiled (and its steady variant, compiled when first needed)."""
    t0 = time.perf_counter()
    log("ptdp_jax: compiling the train step ...")           # minutes for deep pipelines
    first = _compile_step(cfg, run.compiled, run.tx)         # and XLA's own memory analysis
    log(f"ptdp_jax: compiled in {time.perf_counter() - t0:.1f} s"
        + (f" (compilation cache: {run.cache})" if run.cache else ""))
    steady = run.compiled.steady_step
    return Steps(first, steady and partial(_compile_step, cfg, run.compiled, run.tx, steady), log)


def _compile_step(cfg, compiled, tx, jitted=None):
    """The train step (or `jitted`, a variant of it) compiled ahead of its first call (the
    compile training needs anyway), checked against device memory by XLA's memory analysis
    before it runs."""
    from ptdp_jax.training.state import abstract_state
    batch = jax.ShapeDtypeStruct((cfg.train.global_batch_size, cfg.model.seq_len + 1),
                                 jax.numpy.int32, sharding=compiled.batch_sharding)
    jitted = jitted or compiled.step
    exe = jitted.lower(abstract_state(cfg, tx, compiled.shardings), batch).compile()
    preflight.check_compiled(cfg, exe)
    return exe


def _restore_or_init(cfg, compiled, weights, log):
    """(state, start step, run id, checkpoint manager or None): checkpoint.dir's checkpoint if
    resuming, else checkpoint.load_weights's parameters, else a fresh state (start.py)."""
    state, start, run_id, ckpt = ST.restore_or_init(cfg, compiled, weights, log)
    run_id = run_id or new_run_id()
    if ckpt is not None:
        ckpt.run_id = run_id
    return state, start, run_id, ckpt


def _nothing_to_train(cfg, start: int) -> str | None:
    t = cfg.train
    if start >= t.steps:
        where = CK.checkpoint_directory(cfg)
        return (f"nothing to train: the checkpoint in {where} is at step {start} and "
                f"train.steps={t.steps}; to extend the run raise train.steps (with "
                f"train.decay_steps={t.decay_steps or start} its learning-rate schedule stays "
                f"the one it was trained with)")
    if t.stop_at_step and start >= t.stop_at_step:
        return (f"nothing to train: the run is at step {start} and train.stop_at_step="
                f"{t.stop_at_step}; raise or drop train.stop_at_step to go on")
    return None


def _eval_due(cfg, step: int) -> bool:
    t = cfg.train
    return bool(t.eval_every and step % t.eval_every == 0) or step == t.steps


def _read(pending, last_ready):
    """(step, its metrics on the host, seconds, when it ended) of a dispatched step: waits for
    it. Its time runs from the previous step's end (last_ready: the host's time between steps
    counts, so the times add up to the loop's), or, where that is None (the first step, the
    step after an evaluation or a checkpoint), from its own dispatch; the end is the clock's."""
    step, out, dispatched, ends = pending
    out = jax.device_get(out)
    ready = ends.result()
    return step, out, ready - (dispatched if last_ready is None else last_ready), ready


def _host_lr(lr):
    """step -> the learning rate as a float, computed on the host's CPU device: on an
    accelerator it would queue behind the step in flight, and the loop would wait for it."""
    try:
        cpu = jax.local_devices(backend="cpu")[0]
    except RuntimeError:
        return lambda step: float(lr(step))

    def on_cpu(step):
        with jax.default_device(cpu):
            return float(lr(step))
    return on_cpu


def _account(result, out, seconds, runlog, step, cfg, ckpt):
    """Per-step bookkeeping: losses, times, non-finite steps (and stopping after too many)."""
    result.losses.append(float(out["loss"]))
    result.step_times.append(seconds)
    if bool(out["finite"]):
        return
    result.bad_steps += 1
    in_a_row = int(out["bad_steps"])
    runlog.message(f"step {step}: non-finite loss or gradient, update skipped ({in_a_row} in a "
                   f"row)")
    if in_a_row >= D.MAX_BAD_STEPS:
        raise TrainingStopped(
            f"{D.MAX_BAD_STEPS} non-finite steps in a row at step {step}; stopping"
            + (f"; {ckpt.last_good()}" if ckpt else ""))


def _finish(cfg, result, state, feed, runlog, return_params, is_main, log):
    """The end of a run: parameters gathered only when asked (or for the sample), on
    process 0 only; the sample only after a run that reached its end."""
    want_sample = cfg.train.sample_tokens > 0 and result.losses and not result.stopped
    if return_params or want_sample:
        result.params = params_on_host(cfg, state.params)
    SV.release(state)                     # the devices are the sample's from here
    if want_sample and is_main:
        with phase("generate", result.start_step + len(result.losses), cfg, result.run_id):
            result.sample = sample_text(cfg, result.params, feed.tokenizer_spec)
        how = f"temperature {D.SAMPLE_TEMPERATURE:g}, top-k {D.SAMPLE_TOP_K}"
        log(f"--- sample ({how}) ---\n" + result.sample + "\n-----------------------")
    if not return_params:
        result.params = None
    runlog.done(result.losses, result.stopped)


def params_on_host(cfg, params):
    """The canonical parameters as numpy arrays on process 0 (None on the others), one array
    at a time: a device holds one array's canonical copy beside the state, not the model's."""
    from ptdp_jax.training.state import canonical_layer_fn, canonical_shardings
    shardings = canonical_shardings(cfg, jax.tree.leaves(params)[0].sharding.mesh,
                                    make_optimizer(cfg)[0]).params
    out = {}
    for group, arrays in params.items():
        out[group] = {}
        for name, x in arrays.items():
            y = canonical_layer_fn(cfg, shardings[group][name])(x) if group == "layers" else x
            out[group][name] = to_host(y, only_process0=True)
            if y is not x:
                y.delete()
    return out if jax.process_index() == 0 else None


def sample_text(cfg: Config, params, tokenizer_spec: str) -> str:
    """train.sample_tokens tokens after decisions.SAMPLE_PROMPT, at its temperature and top-k."""
    from ptdp_jax.data.tokenizer import load_tokenizer
    from ptdp_jax.run.generate import generate

    tok = load_tokenizer(tokenizer_spec)
    out = generate(cfg.model, params, tok.encode(D.SAMPLE_PROMPT), cfg.train.sample_tokens,
                   temperature=D.SAMPLE_TEMPERATURE, top_k=D.SAMPLE_TOP_K, seed=cfg.train.seed)
    return D.SAMPLE_PROMPT + tok.decode(out)
