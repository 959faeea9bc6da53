"""Evaluation of a checkpoint on any mesh: its training layout where that fits the mesh,
else the layout keys reset to ones that do (`layout_for_mesh`); used by ptdp-eval,
ptdp-generate and `ptdp_jax.load`."""
from __future__ import annotations

import math
from dataclasses import replace

import jax

from ptdp_jax.training.evaluate import evaluate, make_eval_fn

LAYOUT_KEYS = ("schedule", "virtual_stages", "stage_layers")
# the overrides an evaluation takes (`section.*`: any key of the section); the others would
# be ignored, so they are refused
EVAL_KEYS = ("data.*", "train.eval_batches", "train.micro_batch_size", "train.dtype",
             "parallel.*")


def refuse_other_keys(overrides) -> None:
    """ConfigError naming the overrides outside EVAL_KEYS (model.*: from the checkpoint)."""
    from ptdp_jax.config.load import ConfigError
    bad = sorted(k for k in overrides if k.startswith("model."))
    if bad:
        raise ConfigError(f"{', '.join(bad)}: the model settings come from the checkpoint")
    bad = sorted(k for k in overrides
                 if k not in EVAL_KEYS and f"{k.split('.', 1)[0]}.*" not in EVAL_KEYS)
    if bad:
        raise ConfigError(f"{', '.join(bad)}: not a setting of an evaluation; the overrides "
                          f"taken are {', '.join(EVAL_KEYS)}")


def layout_for_mesh(cfg, mesh_shape, given=(), num_devices: int | None = None):
    """cfg on `mesh_shape` for a forward pass (evaluation, generation): the training run's
    layout where it validates there; else its parallel.* keys (and train.micro_batch_size,
    where the batch does not divide) that are not `given` (dotted keys the user set) reset
    to defaults that fit the mesh: schedule 1f1b, v = 1, layers split evenly (or balanced
    where the pipe does not divide them). ConfigError where even those do not fit."""

    from ptdp_jax.config.load import ConfigError, ParallelConfig
    from ptdp_jax.config.validation import validate
    d, p, t = mesh_shape
    on_mesh = replace(cfg, parallel=replace(cfg.parallel, data=d, pipe=p, tensor=t))
    try:
        return validate(on_mesh, num_devices)
    except ConfigError:
        pass
    keep = {k.split(".", 1)[1] for k in given if k.startswith("parallel.")}
    par = replace(ParallelConfig(data=d, pipe=p, tensor=t),
                  **{k: getattr(cfg.parallel, k) for k in keep if k not in ("data", "pipe",
                                                                          "tensor")})
    if ("stage_layers" not in keep and cfg.model.num_layers % (p * par.virtual_stages)
            and cfg.model.num_layers >= p * par.virtual_stages):
        par = replace(par, stage_layers="auto")
    tr = cfg.train
    rows = tr.global_batch_size // d
    if "train.micro_batch_size" not in given and tr.global_batch_size % (tr.micro_batch_size * d) \
            and tr.global_batch_size % d == 0:
        tr = replace(tr, micro_batch_size=max(m for m in range(1, min(rows, tr.micro_batch_size)
                                                               + 1) if rows % m == 0))
    return validate(replace(cfg, parallel=par, train=tr), num_devices)


def describe_layout(cfg) -> str:
    """'schedule interleaved, virtual_stages 2, micro 1': the keys layout_for_mesh may reset."""
    p = cfg.parallel
    return (f"schedule {p.schedule}, virtual_stages {p.virtual_stages}"
            + (f", stage_layers {p.stage_layers}" if p.stage_layers else "")
            + f", micro_batch_size {cfg.train.micro_batch_size}")


def evaluate_checkpoint(checkpoint, mesh=None, overrides=None) -> dict:
    """{'step', 'loss', 'perplexity', 'batches', 'batch_size', 'seq_len', 'layout'} of a
    checkpoint; 'layout' says the keys reset where the training layout does not fit the
    mesh (layout_for_mesh), else is None. Overrides outside EVAL_KEYS: a ConfigError."""
    from ptdp_jax.checkpoint.manager import (check_data_tokenizer, checkpoint_config,
                                             load_params, read_meta, resolve_step_dir)
    from ptdp_jax.config.load import load_config, parse_mesh
    from ptdp_jax.run.feed import Feed
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import stage_params, state_shardings, make_optimizer

    overrides = dict(overrides or {})
    refuse_other_keys(overrides)
    step_dir = resolve_step_dir(checkpoint)
    asked = load_config(checkpoint_config(step_dir), overrides)
    if asked.data.val_path:         # read alone: the training data may be gone (another host)
        asked = replace(asked, data=replace(asked.data, path=asked.data.val_path, weights=()))
    meta = read_meta(step_dir)
    check_data_tokenizer(meta, step_dir, asked)     # before the parameters are read
    _, host_params = load_params(step_dir)           # the parameters only, not the moments
    shape = parse_mesh(mesh) if mesh else (1, 1, 1)
    cfg = layout_for_mesh(asked, shape, overrides, len(jax.devices()))
    reset = None if describe_layout(cfg) == describe_layout(asked) else \
        f"{describe_layout(cfg)} (the training run's {describe_layout(asked)} does not fit " \
        f"mesh {shape})"
    m = make_mesh(cfg.parallel.mesh_dims)
    shardings = state_shardings(cfg, m, make_optimizer(cfg)[0]).params
    params = jax.jit(lambda x: stage_params(cfg, x), out_shardings=shardings)(host_params)
    del host_params
    feed = Feed(cfg, m, train=False)      # data.path unread where data.val_path is given
    eval_fn = jax.jit(make_eval_fn(cfg, m), in_shardings=(shardings, feed.sharding))
    loss = evaluate(eval_fn, params, feed.val_batch, cfg.train.eval_batches)
    return {"step": int(meta["step"]), "loss": loss, "perplexity": math.exp(min(loss, 700.0)),
            "batches": cfg.train.eval_batches, "batch_size": cfg.train.global_batch_size,
            "seq_len": cfg.model.seq_len, "layout": reset}
