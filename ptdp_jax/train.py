"""`train()`: the Python API behind `ptdp-train`.

    from ptdp_jax import train
    result = train("configs/demo.yaml", mesh_shape=(2, 2, 2), overrides={"train.steps": 50})
    result.losses          # one float per step
    result.params          # canonical host numpy arrays (independent of mesh and schedule)
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax import metrics as MX
from ptdp_jax.config import Config, ConfigError, load_config, validate
from ptdp_jax.data import BlendedStream, batch_for_step, open_datasets, validate_data_config
from ptdp_jax.data.tokenizer import load_tokenizer
from ptdp_jax.distributed import any_process, maybe_initialize, to_host
from ptdp_jax.sharding import make_mesh
from ptdp_jax.step import canonical_params, compile_all, make_optimizer


class TrainingStopped(RuntimeError):
    """The run stopped early (too many non-finite steps); the message says why."""


@dataclass
class TrainResult:
    losses: list[float]
    params: Any                                  # canonical numpy pytree
    val_losses: list[tuple[int, float]] = field(default_factory=list)
    sample: str | None = None
    config: Config | None = None
    start_step: int = 0                          # > 0 when resumed from a checkpoint
    bad_steps: int = 0                           # updates skipped for non-finite values
    step_times: list[float] = field(default_factory=list)
    stopped_by_signal: bool = False


def resolve_config(config=None, mesh_shape=None, overrides: Mapping[str, Any] | None = None) -> Config:
    cfg = load_config(config, overrides)
    if mesh_shape is not None:
        if len(tuple(mesh_shape)) != 3 or any(int(a) < 1 for a in mesh_shape):
            raise ConfigError(f"mesh_shape must be three positive ints (data, pipe, tensor), "
                              f"got {tuple(mesh_shape)}")
        d, p, t = (int(a) for a in mesh_shape)
        cfg = replace(cfg, parallel=replace(cfg.parallel, data=d, pipe=p, tensor=t))
    return cfg


def _open_data(cfg: Config):
    """Train and validation streams; validates data keys against the model."""
    cache = os.path.expanduser(cfg.data.cache_dir)
    weights = validate_data_config(list(cfg.data.path), list(cfg.data.weights) or None,
                                   cfg.model.seq_len, cfg.data.val_fraction)
    datasets = open_datasets(list(cfg.data.path), cache)
    for path, ds in zip(cfg.data.path or ("<embedded corpus>",), datasets):
        if ds.vocab_size > cfg.model.vocab_size:
            raise ConfigError(f"data.path {path!r} has vocabulary {ds.vocab_size} but "
                              f"model.vocab_size={cfg.model.vocab_size} is smaller")
    mk = lambda split: BlendedStream(datasets, weights, cfg.model.seq_len, cfg.train.seed,
                                     split=split, val_fraction=cfg.data.val_fraction)
    return mk("train"), mk("val"), datasets


def global_batch(stream, step: int, cfg: Config, sharding: NamedSharding):
    """The global batch of `step` as a sharded array; each device's rows are read
    from disk by the process that owns it (so a host reads only its own part)."""
    B, s = cfg.train.global_batch_size, cfg.model.seq_len
    cache: dict[tuple[int, int], np.ndarray] = {}       # devices holding the same rows: one read

    def rows(index):
        sl = index[0]
        key = (sl.start or 0, sl.stop or B)
        if key not in cache:
            cache[key] = batch_for_step(stream, step, B, rows=slice(*key))
        return cache[key]

    return jax.make_array_from_callback((B, s + 1), sharding, rows)


def _progress(enabled: bool, total: int, initial: int):
    if not enabled:
        return None
    from tqdm.auto import tqdm
    return tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)


def train(config=None, *, mesh_shape=None, overrides: Mapping[str, Any] | None = None,
          log=print, distributed: Mapping[str, Any] | None = None) -> TrainResult:
    """Train a model; see the module docstring. `config` is a YAML path or a Config
    (None: defaults); `mesh_shape` (data, pipe, tensor) uses the first d*p*t devices.
    `distributed`: keyword arguments of ptdp_jax.distributed.maybe_initialize
    (coordinator, num_processes, process_id, ...); without it a multi-process run is
    still started from PTDP_* variables or the cluster's environment."""
    cfg = resolve_config(config, mesh_shape, overrides)
    maybe_initialize(**dict(distributed or {}))
    validate(cfg, len(jax.devices()))
    train_stream, val_stream, datasets = _open_data(cfg)
    is_main = jax.process_index() == 0
    log = log if is_main else (lambda *a, **k: None)

    mesh = make_mesh(cfg.parallel.mesh_shape,
                     allow_cross_host_tensor=cfg.parallel.allow_cross_host_tensor)
    tx, lr_schedule = make_optimizer(cfg)
    compiled = compile_all(cfg, mesh, tx)
    batch_sh = NamedSharding(mesh, P("data"))

    ckpt = None
    if cfg.checkpoint.dir:
        from ptdp_jax import checkpoint as CK
        ckpt = CK.CheckpointManager.from_config(cfg, compiled.shardings)
    state, start = None, 0
    if ckpt is not None and cfg.checkpoint.resume:
        restored = ckpt.restore_latest()
        if restored is not None:
            state, start = restored
            log(f"resumed from {ckpt.directory} at step {start}")
    if state is None:
        state = compiled.init()

    run_dir = Path(cfg.run.dir)
    if start == 0 and is_main and (run_dir / "metrics.jsonl").exists():
        (run_dir / "metrics.jsonl").unlink()          # a fresh run starts a fresh log
    logger = MX.MetricsLogger(run_dir, tensorboard=cfg.run.tensorboard, enabled=is_main)
    n_dev = cfg.parallel.data * cfg.parallel.pipe * cfg.parallel.tensor
    flops = MX.model_flops_per_iteration(cfg, recompute=False)
    peak = MX.peak_flops_per_device(jax.devices()[0])
    tokens_per_step = cfg.train.global_batch_size * cfg.model.seq_len
    d, p, t = cfg.parallel.mesh_shape
    log(f"ptdp_jax: {cfg.model.arch} {cfg.model.num_layers}x{cfg.model.hidden_size}, "
        f"mesh (data, pipe, tensor) = ({d}, {p}, {t}), schedule {cfg.parallel.schedule}"
        f"{' v=%d' % cfg.parallel.virtual_stages if cfg.parallel.virtual_stages > 1 else ''}, "
        f"{cfg.num_microbatches} microbatches of {cfg.train.micro_batch_size}, "
        f"{cfg.train.dtype}, recompute {cfg.train.recompute}")

    guard = CK.StopSignal() if ckpt is not None else None
    result = TrainResult(losses=[], params=None, config=cfg, start_step=start)
    bar = _progress(cfg.run.progress and is_main, cfg.train.steps, start)
    try:
        for step in range(start, cfg.train.steps):
            batch = global_batch(train_stream, step, cfg, batch_sh)
            t0 = time.perf_counter()
            state, out = compiled.step(state, batch)
            loss = float(out["loss"])                     # waits for the step
            dt = time.perf_counter() - t0
            result.losses.append(loss)
            result.step_times.append(dt)
            finite = bool(out["finite"])
            record = {"loss": loss, "lr": float(lr_schedule(step)),
                      "grad_norm": float(out["grad_norm"]), "step_time_s": dt,
                      "tokens_per_s": tokens_per_step / dt,
                      "tflops_per_device": flops / dt / n_dev / 1e12}
            if peak:
                record["mfu"] = flops / dt / n_dev / peak
            if not finite:
                result.bad_steps += 1
                record["skipped_nonfinite"] = 1.0
                log(f"step {step + 1}: non-finite loss or gradient, update skipped "
                    f"({int(state['bad_steps'])} in a row)")
            if (cfg.train.eval_every and (step + 1) % cfg.train.eval_every == 0) \
                    or step + 1 == cfg.train.steps:
                val = evaluate(compiled, state, val_stream, cfg, batch_sh)
                result.val_losses.append((step + 1, val))
                record["val_loss"] = val
            if (step + 1) % cfg.train.log_every == 0 or "val_loss" in record:
                logger.log(step + 1, record)
            if bar is not None:
                bar.update(1)
                speed = (f"{record['mfu']:.1%}" if "mfu" in record
                         else f"{record['tokens_per_s']:.0f} tok/s")
                bar.set_postfix(loss=f"{loss:.4f}", speed=speed,
                                **({"val": f"{record['val_loss']:.4f}"} if "val_loss" in record else {}))
            elif is_main and ((step + 1) % max(cfg.train.log_every, 10) == 0 or step == start):
                log(f"step {step + 1}/{cfg.train.steps} loss {loss:.4f} "
                    f"{record['tokens_per_s']:.0f} tok/s")
            if int(state["bad_steps"]) >= cfg.train.max_bad_steps:
                raise TrainingStopped(
                    f"{cfg.train.max_bad_steps} non-finite steps in a row (train.max_bad_steps="
                    f"{cfg.train.max_bad_steps}) at step {step + 1}; stopping"
                    + (f"; last good checkpoint in {ckpt.directory}" if ckpt else ""))
            if ckpt is not None:
                last = step + 1 == cfg.train.steps
                stop = any_process(guard.requested)       # every process stops at one step
                if last or stop or (cfg.checkpoint.every and (step + 1) % cfg.checkpoint.every == 0):
                    ckpt.save(step + 1, state)
                if stop:
                    log(f"received {guard.name or 'a stop signal (on another process)'} at step "
                        f"{step + 1}: checkpoint written to "
                        f"{ckpt.directory}, exiting")
                    result.stopped_by_signal = True
                    break
    finally:
        if bar is not None:
            bar.close()
        logger.close()
        try:
            if ckpt is not None:
                ckpt.close()              # waits for the last save; raises if it failed
        finally:
            if guard is not None:
                guard.restore()

    result.params = to_host(jax.jit(lambda prm: canonical_params(cfg, prm))(state["params"]))
    if cfg.train.sample_tokens > 0 and is_main:
        result.sample = _sample(cfg, result.params, datasets)
        log("--- sample (greedy) ---\n" + result.sample + "\n-----------------------")
    if result.losses:
        log(f"done: {len(result.losses)} steps, loss {result.losses[0]:.4f} -> "
            f"{result.losses[-1]:.4f}" + (f", val {result.val_losses[-1][1]:.4f}"
                                          if result.val_losses else ""))
    return result


def evaluate(compiled, state, val_stream, cfg: Config, batch_sh) -> float:
    """Mean validation loss over train.eval_batches held-out batches."""
    losses = [float(compiled.eval_loss(state["params"], global_batch(val_stream, i, cfg, batch_sh)))
              for i in range(cfg.train.eval_batches)]
    return float(np.mean(losses))


def _sample(cfg: Config, params, datasets) -> str:
    from ptdp_jax.generate import greedy_generate
    tok = load_tokenizer(datasets[0].tokenizer_spec)
    prompt = tok.encode(cfg.train.sample_prompt)
    out = greedy_generate(cfg.model, params, prompt, cfg.train.sample_tokens)
    return cfg.train.sample_prompt + tok.decode(out)
