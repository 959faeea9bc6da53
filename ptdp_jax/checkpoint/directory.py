"""A checkpoint.dir before a run compiles: what it holds against what the run asks for (resume,
a fresh start, a chosen step, the disk space its checkpoints take), refused in one line naming
the directory and the steps; and the step a run starts from.

    replaced = check_checkpoint_dir(cfg)      # CheckpointError / ConfigError, or the steps the
    start = resume_step(cfg)                  #   run removes at its first save
"""
from __future__ import annotations

import os
from pathlib import Path

from ptdp_jax.checkpoint import saving as SV
from ptdp_jax.checkpoint.format import (CheckpointError, _check_writable, _scan, check_compatible,
                                        check_data_tokenizer, check_directory, step_meta)
from ptdp_jax.checkpoint.numerics import check_same_numerics
from ptdp_jax.config.load import Config, ConfigError
from ptdp_jax.training.state import canonical_abstract_state, make_optimizer


class FreshStartRefused(CheckpointError, ConfigError):
    """A fresh start (checkpoint.resume=false) asked for where earlier checkpoints are: a
    setting to change, so the commands exit with the config code (2)."""


def _fresh_start_message(directory, steps) -> str:
    shown = ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")
    return (f"checkpoint.dir {directory} holds checkpoints of an earlier run (steps {shown}) and "
            f"this run starts fresh (checkpoint.resume=false, --no-resume); they are kept: "
            f"use another checkpoint.dir, resume from them (drop --no-resume), or set "
            f"checkpoint.resume=overwrite to remove them at this run's first save")


class ResumeStepRefused(CheckpointError, ConfigError):
    """checkpoint.resume_step names a checkpoint that is not there, or one with later ones
    after it (without checkpoint.resume=overwrite): a setting to change (exit 2)."""


def _shown_steps(steps) -> str:
    return ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")


def _later_message(directory, step: int, later) -> str:
    return (f"checkpoint.resume_step={step}: {directory} holds later checkpoints (steps "
            f"{_shown_steps(later)}), which would mix with this run's; they are kept: add "
            f"checkpoint.resume=overwrite to remove them at this run's first save, or move them "
            f"out of checkpoint.dir")


def _check_resume_step(cfg: Config, directory: Path, steps: list[int]) -> list[int]:
    """The checkpoints after checkpoint.resume_step (removed at the first save with
    checkpoint.resume=overwrite); ResumeStepRefused for a step that is not there, or for
    later ones without overwrite. [] without resume_step."""
    step = cfg.checkpoint.resume_step
    if step is None:
        return []
    if step not in steps:
        held = f"steps {_shown_steps(steps)}" if steps else "no complete checkpoint"
        raise ResumeStepRefused(f"checkpoint.resume_step={step}: {directory} holds no "
                                f"checkpoint of step {step}; it holds {held}")
    later = [s for s in steps if s > step]
    if later and not cfg.checkpoint.overwrites:
        raise ResumeStepRefused(_later_message(directory, step, later))
    return later


def replaced_message(cfg: Config, replaced: list[int]) -> str:
    """The line naming the checkpoints a run removes at its first save (`replaced`:
    check_checkpoint_dir's)."""
    directory = checkpoint_directory(cfg)
    which = (f"the checkpoints after step {cfg.checkpoint.resume_step}"
             if cfg.checkpoint.resumes else "the earlier run's checkpoints")
    return (f"checkpoint.resume=overwrite: {which} in {directory} (steps "
            f"{_shown_steps(replaced)}) are removed at this run's first save")


def checkpoint_directory(cfg: Config) -> Path:
    """checkpoint.dir as an absolute path (~ expanded)."""
    return Path(os.path.expanduser(cfg.checkpoint.dir)).absolute()


def check_fresh_start(cfg: Config) -> list[int]:
    """Before a run: with checkpoint.resume=false and a checkpoint.dir that holds
    checkpoints, CheckpointError unless checkpoint.resume=overwrite. Returns the steps
    that this run will remove at its first save ([] if none)."""
    if not cfg.checkpoint.dir or cfg.checkpoint.resumes:
        return []
    directory = checkpoint_directory(cfg)
    check_directory(directory)
    steps = _scan(directory)[0]
    if steps and not cfg.checkpoint.overwrites:
        raise FreshStartRefused(_fresh_start_message(directory, steps))
    return steps


def check_checkpoint_dir(cfg: Config) -> list[int]:
    """Before a run compiles: CheckpointError for a checkpoint.dir that cannot serve it (a
    file, not writable, holding files of something else, or, when resuming, a newest
    checkpoint that is unreadable, of another model or of another tokenizer's ids); with
    checkpoint.resume false or overwrite, check_fresh_start. Returns the steps this run will remove at its first save."""
    if not cfg.checkpoint.dir:
        return []
    directory = checkpoint_directory(cfg)
    _check_writable(directory)
    check_directory(directory)
    per_checkpoint = SV.checkpoint_bytes(canonical_abstract_state(cfg, make_optimizer(cfg)[0]))
    if not cfg.checkpoint.resumes:
        replaced = check_fresh_start(cfg)
        SV.check_disk(cfg, directory, per_checkpoint, 0, 0,
                      reclaimed=len(replaced) * per_checkpoint)
        return replaced
    steps = _scan(directory)[0]
    later = _check_resume_step(cfg, directory, steps)
    start = resume_from(cfg)
    if start is not None:
        where = directory / str(start)
        meta = step_meta(where, resuming=True)
        check_data_tokenizer(meta, where, cfg)      # first: another tokenizer's data has
        check_compatible(meta, cfg, str(where))     # another model.vocab_size too
        check_same_numerics(meta, cfg, str(where))
    SV.check_disk(cfg, directory, per_checkpoint, len(steps) - len(later), start or 0,
                  reclaimed=len(later) * per_checkpoint)
    return later


def resume_from(cfg: Config) -> int | None:
    """The checkpoint of checkpoint.dir a run of cfg resumes from (checkpoint.resume_step, else
    its newest complete one), or None where it starts fresh (no checkpoint.dir, none in it, or
    a fresh start asked for). check_checkpoint_dir checks that resume_step's is there."""
    if not cfg.checkpoint.dir or not cfg.checkpoint.resumes:
        return None
    if cfg.checkpoint.resume_step is not None:
        return cfg.checkpoint.resume_step
    steps = _scan(checkpoint_directory(cfg))[0]
    return steps[-1] if steps else None


def resume_step(cfg: Config) -> int:
    """The step a run of cfg starts from: resume_from's, else 0 (read before anything
    compiles)."""
    step = resume_from(cfg)
    return 0 if step is None else step


