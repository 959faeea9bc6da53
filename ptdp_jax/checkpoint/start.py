"""Where a training run starts (train()'s restore phase): its checkpoint.dir's checkpoint when
it resumes, else the parameters of checkpoint.load_weights (weights.py), else a fresh
initialisation from train.seed."""
from __future__ import annotations

from ptdp_jax.checkpoint.format import VERSION, config_from_dict, read_meta
from ptdp_jax.checkpoint.manager import CheckpointManager, resume_from
from ptdp_jax.checkpoint.weights import KEY as LOAD_WEIGHTS, weights_state


def restore_or_init(cfg, compiled, weights, log):
    """(state, start step, the run id to keep or None, checkpoint manager or None) of a run of
    cfg compiled as `compiled` (step.Compiled); `weights`: check_load_weights's source, or
    None."""
    ckpt = CheckpointManager.from_config(cfg, compiled.shardings) if cfg.checkpoint.dir else None
    step = resume_from(cfg) if ckpt is not None else None
    if step is not None:
        return (*_resume(cfg, ckpt, step, log), ckpt)
    if weights is not None:
        state = weights_state(weights, cfg, compiled)
        log(f"{LOAD_WEIGHTS}: starting at step 0 from the parameters of {weights.describe()}, "
            f"with a fresh optimizer state")
        return state, 0, None, ckpt
    return compiled.init(), 0, None, ckpt


def _resume(cfg, ckpt, step: int, log):
    """(state, step, run id or None) of checkpoint `step` of ckpt, said in a line (and one
    more where checkpoint.load_weights is set: a resume ignores it)."""
    state = ckpt.restore(step)
    meta = read_meta(ckpt.directory / str(step))
    old = (f" (format version {meta['version']}: GPT's fused QKV weight split into q, k, v; "
           f"the next checkpoint is written as version {VERSION})"
           if meta["version"] != VERSION else "")
    log(f"resumed from {ckpt.directory} at step {step}{old}")
    note = changed_settings(meta, cfg)
    if note:
        log(note)
    if cfg.checkpoint.load_weights:
        log(f"{LOAD_WEIGHTS}={cfg.checkpoint.load_weights} ignored: the run resumes from its "
            f"checkpoint.dir")
    return state, step, meta.get("run_id")


# what a change of each from the checkpoint's run does to the steps after it
EFFECTS = {"global_batch_size": "batches of another size (other samples from here)",
           "seed": "another data order and other dropout masks",
           "lr": "another learning-rate schedule"}


def changed_settings(meta: dict, cfg) -> str | None:
    """A line naming train.global_batch_size, train.seed and train.lr where cfg's differ from
    those of the run that wrote the checkpoint (`meta`), with what that changes; else None."""
    saved = config_from_dict(meta["config"]).train
    keys = [k for k in EFFECTS if getattr(saved, k) != getattr(cfg.train, k)]
    if not keys:
        return None
    changes = ", ".join(f"train.{k} {getattr(saved, k)} -> {getattr(cfg.train, k)}" for k in keys)
    return (f"note: resumed with settings other than the checkpoint's: {changes} (from step "
            f"{meta['step']} on: {'; '.join(EFFECTS[k] for k in keys)})")
