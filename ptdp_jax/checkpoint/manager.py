"""Checkpoints: asynchronous orbax saves in a layout independent of mesh and schedule.

    ckpt = CheckpointManager.from_config(cfg, compiled.shardings)
    restored = ckpt.restore_latest()        # (state, step) or None
    ckpt.save(step, state)                  # returns once the arrays are copied off the devices
    ckpt.close()                            # waits for the writes in flight

On disk, ``<checkpoint.dir>/<step>/`` is one orbax step directory with these items:

- ``state``: the train state in the *canonical* layout (``TrainState.as_dict()``:
  ``params``, ``opt``, ``step``, ``bad_steps``): parameters and the AdamW
  moments (mu, nu) with layers on one leading axis of length L, the optimizer's
  step count, ``step`` and ``bad_steps``. No per-stage or per-chunk files: a
  checkpoint written with any (data, pipe, tensor) mesh and schedule restores on
  any other valid one (it is resharded on the way in).
- ``meta``: JSON (``ptdp_meta.json``): format tag, step, the data stream's
  position (consumed samples = step x global batch; batches are a pure function
  of (seed, step)), the RNG state (the seed; dropout keys are derived from
  (seed, step, row)), the resolved config (data.path absolute), the layout it was
  written with, the canonical parameter shapes and the tokenizer ('byte', or the
  file of the next item).
- ``tokenizer``: a copy of the training data's ``tokenizer.json`` (and a
  ``tokenizer_config.json`` beside it), so that eval, generate and export find the
  tokenizer when the data has moved.

Orbax writes each step into ``<step>.orbax-checkpoint-tmp`` and renames it to
``<step>`` only after every file is written, so a save interrupted by a crash or
SIGKILL is never taken for a complete checkpoint (leftover temporary
directories are ignored and removed by the next run). Loading reads JSON and
tensorstore arrays, nothing else: no pickle, no code.

A directory that holds something else, a corrupt checkpoint, or one of a
different model raises ``CheckpointError`` (a ValueError) naming what is wrong,
before anything is written. A failed write (e.g. a full disk) raises
``CheckpointError`` at the next ``save`` or at ``close``; the previous
checkpoints are untouched.

Test hooks (environment variables, read at save time, used by the fault tests):
``PTDP_TEST_SAVE_DELAY=[STEP:]SECONDS`` sleeps inside the background write of
the checkpoint (of STEP only, if given), after it has started and before it is
committed; ``PTDP_TEST_SAVE_FAULT=enospc[:STEP]`` makes that write fail with
``OSError(ENOSPC)``.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import jax
import orbax.checkpoint as ocp

from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.checkpoint import saving as SV
from ptdp_jax.checkpoint import upgrade as ckpt_upgrade
from ptdp_jax.training import fp8_state as FS
from ptdp_jax.config.load import Config, with_absolute_paths
from ptdp_jax.data import data_state
from ptdp_jax.pipeline.balance import chunk_layers
from ptdp_jax.checkpoint.format import (  # noqa: F401  (re-exported: the public checkpoint API)
    FORMAT, META_FILE, META_ITEM, STATE_ITEM, TOKENIZER_ITEM, VERSION, CheckpointError,
    _check_writable, _FilesHandler, _FilesSave, _scan, _shape_tree, _short, check_compatible,
    check_data_tokenizer, check_directory, checkpoint_config, checkpoint_tokenizer, config_from_dict, damaged_message,
    load_checkpoint, load_params, quiet_closed_loop, quiet_orbax_errors, read_meta, resolve_step_dir, run_tokenizer,
    step_meta, stored_shapes, tokenizer_files)
from ptdp_jax.training.state import (  # noqa: F401  (re-exported: the public checkpoint API)
    TrainState, canonical_abstract_state, canonical_shardings, make_optimizer,
    to_canonical_state, to_stage_state, with_shardings as _with_shardings)
from ptdp_jax.parallel.stopping import StopSignal  # noqa: F401  (re-exported)
from ptdp_jax.checkpoint.directory import (  # noqa: F401  (re-exported: the public checkpoint API)
    FreshStartRefused, ResumeStepRefused, _fresh_start_message, _later_message,
    check_checkpoint_dir, check_fresh_start, checkpoint_directory, replaced_message, resume_from,
    resume_step)

# ----------------------------------------------------------------------------- test hooks

def _hook_step(spec: str) -> tuple[int | None, str]:
    if ":" in spec:
        a, b = spec.split(":", 1)
        return int(a), b
    return None, spec


def _test_hooks(step: int) -> None:
    """Fault injection for the tests (see the module docstring); runs in the write path."""
    delay = os.environ.get("PTDP_TEST_SAVE_DELAY")
    if delay:
        only, seconds = _hook_step(delay)
        if only is None or only == step:
            print(f"PTDP_TEST_SAVE_DELAY: checkpoint of step {step} in flight, "
                  f"sleeping {float(seconds)} s", file=sys.stderr, flush=True)
            time.sleep(float(seconds))
    fault = os.environ.get("PTDP_TEST_SAVE_FAULT")
    if fault:
        kind, _, only = fault.partition(":")
        if kind == "enospc" and (not only or int(only) == step):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _MetaHandler(ocp.JsonCheckpointHandler):
    """orbax's JSON handler under our file name, with the test hooks in its
    (background) write."""

    def __init__(self):
        super().__init__(META_FILE)

    async def _save_fn(self, x, directory):
        _test_hooks(int(x["step"]))
        await super()._save_fn(x, directory)


@ocp.args.register_with_handler(_MetaHandler, for_save=True)
@dataclasses.dataclass
class _MetaSave(ocp.args.CheckpointArgs):
    item: dict


@ocp.args.register_with_handler(_MetaHandler, for_restore=True)
@dataclasses.dataclass
class _MetaRestore(ocp.args.CheckpointArgs):
    item: Any = None


# ----------------------------------------------------------------------------- the manager

class CheckpointManager:
    """Asynchronous checkpoints of the train state in checkpoint.dir (see module doc)."""

    def __init__(self, cfg: Config, shardings, directory: str | os.PathLike | None = None,
                 run_id: str | None = None):
        self.cfg = cfg
        self.run_id = run_id                  # stored in the metadata; a resumed run keeps it
        self.shardings = shardings
        self.directory = Path(os.path.expanduser(directory or cfg.checkpoint.dir)).absolute()
        self.keep = cfg.checkpoint.keep
        self.mesh = shardings.step.mesh
        self.tx, _ = make_optimizer(cfg)
        check_directory(self.directory)
        self._canon_sh = canonical_shardings(cfg, self.mesh, self.tx)
        # what orbax restores: the stored tree (TrainState.as_dict), with the canonical shardings
        self._abstract = _with_shardings(canonical_abstract_state(cfg, self.tx),
                                         self._canon_sh).as_dict()
        self._all_finite = jax.jit(lambda p: jax.tree.reduce(
            lambda a, x: a & jax.numpy.isfinite(x).all(), p, jax.numpy.bool_(True)))
        self.checkpoint_bytes = SV.checkpoint_bytes(canonical_abstract_state(cfg, self.tx))
        self._in_flight: int | None = None     # the step of the newest save started
        self._to_stage = jax.jit(lambda s: to_stage_state(cfg, self.tx, s),
                                 out_shardings=shardings, donate_argnums=(0,))
        self._resumed: int | None = None        # the step restored, if any
        self._failed: CheckpointError | None = None
        self._saved_any = False
        self._closed = False
        self._mngr = None
        self.tokenizer = run_tokenizer(cfg)   # kept in each checkpoint (None: not known)
        self._tokenizer_files = None
        quiet_orbax_errors(cfg.run.dir)

    @classmethod
    def from_config(cls, cfg: Config, shardings, run_id: str | None = None) -> "CheckpointManager":
        return cls(cfg, shardings, run_id=run_id)

    # -- orbax
    def _manager(self) -> ocp.CheckpointManager:
        if self._mngr is None:
            opts = ocp.CheckpointManagerOptions(
                enable_async_checkpointing=True, create=True, cleanup_tmp_directories=True,
                preservation_policy=ocp.checkpoint_managers.LatestN(n=self.keep),
                save_root_metadata=False)
            self._mngr = ocp.CheckpointManager(
                self.directory, options=opts,
                item_handlers={STATE_ITEM: ocp.StandardCheckpointHandler(),
                               META_ITEM: _MetaHandler(), TOKENIZER_ITEM: _FilesHandler()})
        return self._mngr

    def due(self, step: int) -> bool:
        """Whether step `step` (1-based) is saved: every checkpoint.every steps and the last."""
        every = self.cfg.checkpoint.every
        return step == self.cfg.train.steps or bool(every and step % every == 0)

    def steps(self) -> list[int]:
        """Step numbers of the complete checkpoints in the directory."""
        return _scan(self.directory)[0]

    # -- restore
    def restore_latest(self):
        """(state, step) from the newest complete checkpoint, in the current layout
        and shardings; None if there is none. CheckpointError if it is unusable."""
        steps = self.steps()
        if not steps:
            return None
        step = steps[-1]
        return self.restore(step), step

    def restore(self, step: int):
        where = self.directory / str(step)
        meta = step_meta(where, resuming=True)
        if int(meta["step"]) != step:
            raise CheckpointError(f"checkpoint {where} is corrupt: its metadata says step "
                                  f"{meta['step']}")
        check_compatible(meta, self.cfg, str(where))
        old = meta["version"] == 1          # GPT's fused QKV: restored fused, then split
        abstract = ckpt_upgrade.v1_abstract(self._abstract) if old else self._abstract
        abstract = self._with_stored_fp8(abstract, config_from_dict(meta["config"]))
        quiet_closed_loop()
        try:
            restored = self._manager().restore(step, args=ocp.args.Composite(**{
                STATE_ITEM: ocp.args.StandardRestore(abstract)}))[STATE_ITEM]
        except Exception as e:      # orbax/tensorstore raise many kinds; one clear error
            self.close()
            raise CheckpointError(damaged_message(where, e, resuming=True)) from e
        if old:
            restored = ckpt_upgrade.from_v1(restored, like=self._abstract)
        restored = dict(restored, fp8=FS.for_config(self.cfg, restored.get("fp8")))
        if int(restored["step"]) != step:
            raise CheckpointError(f"checkpoint {where} is corrupt: its state says step "
                                  f"{int(restored['step'])}")
        self._resumed = step
        return self._to_stage(TrainState.of(restored))

    def _with_stored_fp8(self, abstract: dict, saved: Config) -> dict:
        """The stored tree's abstract: with the FP8 history that the checkpoint's run kept (which
        this run may keep longer, shorter or not at all: FS.for_config)."""
        out = {k: v for k, v in abstract.items() if k != "fp8"}
        stored = FS.stored_abstract(saved, NamedSharding(self.mesh, P()))
        return out if stored is None else dict(out, fp8=stored)

    # -- save
    def _meta(self, step: int) -> dict:
        cfg = with_absolute_paths(self.cfg)
        d, p, t = cfg.parallel.mesh_shape
        tree = cfg.to_dict()
        tok = self.tokenizer
        kept = tok if tok in (None, "byte") else {"file": f"{TOKENIZER_ITEM}/tokenizer.json",
                                                  "source": tok}
        return {
            "format": FORMAT, "version": VERSION, "step": int(step),
            "data": dict(data_state(step, cfg.train.global_batch_size),
                         seed=cfg.train.seed, paths=list(cfg.data.path),
                         weights=list(cfg.data.weights)),
            "rng": {"seed": cfg.train.seed,
                    "dropout_keys": "fold_in(fold_in(key(train.seed), step), global row)"},
            "config": json.loads(json.dumps(tree)),
            "layout": {"mesh": [d, p, t], "schedule": cfg.parallel.schedule,
                       "virtual_stages": cfg.parallel.virtual_stages,
                       "chunk_layers": list(chunk_layers(cfg))},
            "param_shapes": _shape_tree(cfg.model),
            "time": time.time(),
            **({"run_id": self.run_id} if self.run_id else {}),
            **({"tokenizer": kept} if kept is not None else {}),
        }

    def _drop_stale(self) -> None:
        """A run owns the directory from its first save on: the checkpoints it did not resume
        from (all, after a fresh start; those after its step, after checkpoint.resume_step)
        are removed, but only with checkpoint.resume=overwrite (check_checkpoint_dir refuses
        the run before that)."""
        resumed = self._resumed
        old_steps = [s for s in self.steps() if resumed is None or s > resumed]
        if old_steps and not self.cfg.checkpoint.overwrites:
            raise (FreshStartRefused(_fresh_start_message(self.directory, old_steps))
                   if resumed is None else
                   ResumeStepRefused(_later_message(self.directory, resumed, old_steps)))
        for old in old_steps:
            where = self.directory / str(old)
            read_meta(where)              # never delete what is not ours
            if jax.process_index() == 0:
                shutil.rmtree(where)
        if self._mngr is not None:
            self._mngr.reload()
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils
            multihost_utils.sync_global_devices("ptdp_checkpoint_drop_stale")

    def save(self, step: int, state) -> None:
        """Start an asynchronous save of `state` (a TrainState, or a mapping of its names) as
        checkpoint `step`. Returns once the arrays are copied to host memory; the files are
        written in the background. Errors of an earlier save are raised here."""
        if self._closed:
            raise CheckpointError("save() after close()")
        if not self._saved_any:
            self._drop_stale()
        if self._failed is not None:
            raise self._failed
        self._check_room(step)
        state = TrainState.of(state)
        canonical = SV.canonical_on_host(self.cfg, self.tx, state, self._canon_sh).as_dict()
        if self._tokenizer_files is None:
            try:
                self._tokenizer_files = tokenizer_files(self.tokenizer)
            except OSError:                 # gone since the data was opened: keep none
                self._tokenizer_files, self.tokenizer = {}, None
        # good: finite weights, written outside a streak of non-finite steps (those may have
        # come from weights an update already ruined); a stopped run names the newest good one
        good = bool(self._all_finite(state.params)) and int(state.bad_steps) == 0
        meta = dict(self._meta(step), good=good)
        items = {STATE_ITEM: ocp.args.StandardSave(canonical), META_ITEM: _MetaSave(meta)}
        if self._tokenizer_files:
            items[TOKENIZER_ITEM] = _FilesSave(self._tokenizer_files)
        try:
            self._manager().save(step, args=ocp.args.Composite(**items), force=True)
        except Exception as e:
            _reraise_lost_peer(e)
            self._failed = self._write_error(e)
            raise self._failed from e
        finally:
            SV.release(canonical)           # orbax holds its own host copy from here
        self._saved_any = True
        self._in_flight = step

    def _check_room(self, step: int) -> None:
        """Before a save: CheckpointError when checkpoint.dir is gone or its disk cannot take
        one more checkpoint (the earlier ones stay as they are)."""
        if (self._saved_any or self._resumed is not None) and SV.directory_gone(self.directory):
            raise self._gone(step)
        done = self.steps()
        if not done:              # the first: orbax's own error says it (its arrays may compress)
            return
        size = SV.tree_bytes(self.directory / str(done[-1]))
        free = SV.free_bytes(self.directory)
        if free < size:
            self._failed = CheckpointError(
                f"checkpoint save of step {step} to {self.directory} not started (disk full: "
                f"{free / 1e9:.2f} GB free, the previous checkpoint took {size / 1e9:.2f} GB); "
                f"{self.survivor()}")
            raise self._failed

    def last_good(self) -> str:
        """Words naming the newest good checkpoint (finite weights, written outside a streak
        of non-finite steps): where a run stopped for non-finite steps should resume from."""
        self.wait_quietly()
        for step in reversed(self.steps()):
            if read_meta(self.directory / str(step)).get("good", True):
                return f"last good checkpoint: {self.directory / str(step)}"
        return f"no checkpoint in {self.directory} was written before the non-finite steps"

    def wait_quietly(self) -> None:
        try:
            self.wait()
        except CheckpointError:
            pass

    def _gone(self, step: int) -> CheckpointError:
        self._failed = CheckpointError(
            f"checkpoint save of step {step} failed (the directory vanished: {self.directory} "
            f"no longer exists); no checkpoint of this run survives there")
        return self._failed

    def survivor(self) -> str:
        done = self.steps()
        return (f"the previous checkpoint (step {done[-1]}) is intact: "
                f"{self.directory / str(done[-1])}" if done else
                "no complete checkpoint was written")

    def wait(self) -> None:
        """Block until every save in flight is written (and raise its error, if any,
        once)."""
        if self._mngr is not None and self._failed is None:
            try:
                self._mngr.wait_until_finished()
            except Exception as e:
                _reraise_lost_peer(e)
                self._failed = self._write_error(e)
                raise self._failed from e

    def close(self) -> None:
        """Wait for the saves in flight, then release orbax's resources. Idempotent.
        Raises CheckpointError if a save failed (unless save() already raised it)."""
        if self._closed:
            return
        self._closed = True
        if self._mngr is None:
            return
        try:
            self.wait()
        finally:
            try:
                self._mngr.wait_until_finished()      # after a failure: drain orbax's threads
            except Exception:
                pass
            try:
                self._mngr.close()
            except Exception:
                pass

    def _write_error(self, e: BaseException) -> CheckpointError:
        if isinstance(e, CheckpointError):
            return e
        what = SV.failure_cause(e)
        if self._saved_any and SV.directory_gone(self.directory):
            what = "the directory vanished"
        step = f" of step {self._in_flight}" if self._in_flight is not None else ""
        survives = (self.survivor() if what != "the directory vanished"
                    else "no checkpoint of this run survives there")
        return CheckpointError(f"checkpoint save{step} to {self.directory} failed ({what}: "
                               f"{_short(e, 160)}); {survives}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _reraise_lost_peer(e: BaseException) -> None:
    """Multi-process: a save that failed in a cross-process operation (a peer died) is
    not a checkpoint error; the exception goes on to the peer watchdog, which names the
    lost process (exit code 4)."""
    from ptdp_jax.parallel.watchdog import _looks_like_lost_peer
    if jax.process_count() > 1 and _looks_like_lost_peer(e):
        raise e


__all__ = ["CheckpointError", "CheckpointManager", "ResumeStepRefused", "StopSignal",
           "check_checkpoint_dir", "replaced_message",
           "checkpoint_directory",
           "check_fresh_start",
           "checkpoint_config", "checkpoint_tokenizer",
           "load_checkpoint", "load_params", "read_meta", "resolve_step_dir", "resume_from",
           "resume_step",
           "stored_shapes", "to_canonical_state", "to_stage_state"]
