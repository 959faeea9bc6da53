"""Checkpoints: asynchronous orbax saves in a layout independent of mesh and schedule.

    ckpt = CheckpointManager.from_config(cfg, compiled.shardings)
    restored = ckpt.restore_latest()        # (state, step) or None
    ckpt.save(step, state)                  # returns once the arrays are copied off the devices
    ckpt.close()                            # waits for the writes in flight

On disk, ``<checkpoint.dir>/<step>/`` is one orbax step directory with two items:

- ``state``: the train state in the *canonical* layout: parameters and the AdamW
  moments (mu, nu) with layers on one leading axis of length L, the optimizer's
  step count, ``step`` and ``bad_steps``. No per-stage or per-chunk files: a
  checkpoint written with any (data, pipe, tensor) mesh and schedule restores on
  any other valid one (it is resharded on the way in).
- ``meta``: JSON (``ptdp_meta.json``): format tag, step, the data stream's
  position (consumed samples = step x global batch; batches are a pure function
  of (seed, step)), the RNG state (the seed; dropout keys are derived from
  (seed, step, row)), the resolved config, the layout it was written with and the
  canonical parameter shapes.

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
import re
import shutil
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.config import Config, ConfigError, flatten, load_config
from ptdp_jax.data import data_state
from ptdp_jax.models import model as M
from ptdp_jax.sharding import logical_to_spec

FORMAT = "ptdp_jax-checkpoint"
VERSION = 1
META_FILE = "ptdp_meta.json"
STATE_ITEM, META_ITEM = "state", "meta"
_TMP_MARK = ".orbax-checkpoint-tmp"
# Files orbax itself may keep at the top of a checkpoint directory.
_ORBAX_ROOT_FILES = {"_ROOT_METADATA", "descriptor", "_CHECKPOINT_METADATA"}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used (foreign, corrupt, another model)
    or a checkpoint that could not be written; the message says what and where."""


# ----------------------------------------------------------------------------- config in meta

def config_from_dict(tree: dict) -> Config:
    """A Config from the dict stored in a checkpoint (unknown keys are an error)."""
    return load_config(None, flatten(tree))


def read_meta(step_dir: str | os.PathLike) -> dict:
    """The JSON metadata of one step directory; CheckpointError if missing or unreadable."""
    step_dir = Path(step_dir)
    path = step_dir / META_ITEM / META_FILE
    if not path.is_file():
        raise CheckpointError(f"{step_dir} is not a ptdp_jax checkpoint: no {META_ITEM}/{META_FILE}")
    try:
        meta = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"checkpoint {step_dir} is corrupt: cannot read {path.name}: {e}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise CheckpointError(f"{step_dir} is not a ptdp_jax checkpoint ({path.name} has no "
                              f"format {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise CheckpointError(f"checkpoint {step_dir} has format version {meta.get('version')}, "
                              f"this ptdp_jax reads version {VERSION}")
    for key in ("step", "config", "param_shapes"):
        if key not in meta:
            raise CheckpointError(f"checkpoint {step_dir} is corrupt: {path.name} lacks {key!r}")
    return meta


def _meta_config(meta: dict, where) -> Config:
    try:
        return config_from_dict(meta["config"])
    except (ConfigError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {where}: its config cannot be read: {e}") from None


def checkpoint_config(step_dir: str | os.PathLike) -> Config:
    """The resolved config a checkpoint was written with."""
    return _meta_config(read_meta(step_dir), step_dir)


def _model_keys(m) -> dict[str, Any]:
    """The model settings that decide parameter shapes (and the model's identity)."""
    keys = {"model.arch": m.arch, "model.num_layers": m.num_layers,
            "model.hidden_size": m.hidden_size, "model.num_heads": m.num_heads,
            "model.ffn_hidden_size": m.ffn, "model.vocab_size": m.vocab_size}
    if m.arch == "gpt":
        keys["model.seq_len"] = m.seq_len        # learned positions: a (seq_len, h) table
    return keys


def _shape_tree(model_cfg) -> dict:
    return jax.tree.map(list, M.param_shapes(model_cfg), is_leaf=lambda x: isinstance(x, tuple))


def check_compatible(meta: dict, cfg: Config, where: str) -> None:
    """CheckpointError naming every model setting where checkpoint and config differ."""
    ck = _meta_config(meta, where)
    a, b = _model_keys(ck.model), _model_keys(cfg.model)
    diffs = [f"{k}: checkpoint {a[k]}, config {b.get(k)}" for k in a if a[k] != b.get(k)]
    diffs += [f"{k}: checkpoint (none), config {b[k]}" for k in b if k not in a]
    if not diffs and meta["param_shapes"] != _shape_tree(cfg.model):
        diffs.append("parameter shapes differ: checkpoint "
                     f"{meta['param_shapes']}, config {_shape_tree(cfg.model)}")
    if diffs:
        raise CheckpointError(f"checkpoint {where} is of a different model: " + "; ".join(diffs))


# ----------------------------------------------------------------------------- layouts

def _layer_marks(cfg):
    """Params-shaped tree: True on stacked-layer leaves."""
    shapes = M.param_shapes(cfg.model)
    return {g: {k: g == "layers" for k in grp} for g, grp in shapes.items()}


def _map_layers(cfg, tx, state, fn):
    """Apply fn to every stacked-layer array of the params and of the optimizer moments."""
    marks = _layer_marks(cfg)
    params = {g: {k: fn(x) if marks[g][k] else x for k, x in grp.items()}
              for g, grp in state["params"].items()}
    opt = optax.tree_map_params(tx, lambda x, is_layer: fn(x) if is_layer else x,
                                state["opt"], marks, transform_non_params=lambda x: x)
    return dict(state, params=params, opt=opt)


def to_canonical_state(cfg, tx, state):
    """Train state in stage layout (p, v, L/(p*v), ...) -> canonical (L, ...)."""
    p, v = cfg.parallel.pipe, cfg.parallel.virtual_stages
    return _map_layers(cfg, tx, state,
                       lambda x: M.to_canonical_layout({"x": x}, p, v)["x"])


def to_stage_state(cfg, tx, state):
    """Inverse of to_canonical_state."""
    p, v = cfg.parallel.pipe, cfg.parallel.virtual_stages
    return _map_layers(cfg, tx, state, lambda x: M.to_stage_layout({"x": x}, p, v)["x"])


def canonical_abstract_state(cfg, tx):
    """ShapeDtypeStructs of the canonical train state (no shardings)."""
    def init():
        params = M.init_params(cfg.model, cfg.train.seed)
        return {"params": params, "opt": tx.init(params),
                "step": jax.numpy.zeros((), jax.numpy.int32),
                "bad_steps": jax.numpy.zeros((), jax.numpy.int32)}
    return jax.eval_shape(init)


def canonical_shardings(cfg, mesh, tx):
    """Shardings of the canonical state on `mesh`: like the stage layout's, with the
    layer axis split over 'pipe' (so with v = 1 each stage keeps its own layers)."""
    axes = M.param_logical_axes(cfg.model)
    spec = {g: {k: logical_to_spec(n) for k, n in grp.items()} for g, grp in axes.items()}
    spec["layers"] = {k: P("pipe", *logical_to_spec(n[1:])) for k, n in axes["layers"].items()}
    param_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), spec,
                            is_leaf=lambda x: isinstance(x, P))
    rep = NamedSharding(mesh, P())
    abstract = canonical_abstract_state(cfg, tx)
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, abstract["opt"], param_sh,
                                   transform_non_params=lambda _: rep)
    return {"params": param_sh, "opt": opt_sh, "step": rep, "bad_steps": rep}


def _with_shardings(abstract, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


# ----------------------------------------------------------------------------- directory checks

def _step_of(name: str) -> int | None:
    return int(name) if re.fullmatch(r"\d+", name) else None


def _scan(directory: Path) -> tuple[list[int], list[str], list[str]]:
    """(complete step numbers, temporary (incomplete) entries, foreign entries)."""
    steps, tmp, foreign = [], [], []
    if not directory.exists():
        return steps, tmp, foreign
    for entry in sorted(directory.iterdir()):
        name = entry.name
        if name.startswith("."):
            continue
        if _TMP_MARK in name:
            tmp.append(name)
        elif entry.is_dir() and _step_of(name) is not None:
            steps.append(int(name))
        elif name not in _ORBAX_ROOT_FILES:
            foreign.append(name)
    return sorted(steps), tmp, foreign


def check_directory(directory: Path) -> None:
    """CheckpointError if `directory` is not (or cannot become) a ptdp_jax checkpoint dir."""
    if directory.exists() and not directory.is_dir():
        raise CheckpointError(f"checkpoint.dir {directory} exists and is not a directory")
    _, _, foreign = _scan(directory)
    if foreign:
        shown = ", ".join(foreign[:5]) + (", ..." if len(foreign) > 5 else "")
        raise CheckpointError(
            f"checkpoint.dir {directory} holds files that are not ptdp_jax checkpoints "
            f"({shown}); use an empty or new directory")


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

    def __init__(self, cfg: Config, shardings, directory: str | os.PathLike | None = None):
        from ptdp_jax.step import make_optimizer

        self.cfg = cfg
        self.shardings = shardings
        self.directory = Path(os.path.expanduser(directory or cfg.checkpoint.dir)).absolute()
        self.keep = cfg.checkpoint.keep
        self.mesh = shardings["step"].mesh
        self.tx, _ = make_optimizer(cfg)
        check_directory(self.directory)
        self._canon_sh = canonical_shardings(cfg, self.mesh, self.tx)
        self._abstract = _with_shardings(canonical_abstract_state(cfg, self.tx), self._canon_sh)
        self._to_canonical = jax.jit(lambda s: to_canonical_state(cfg, self.tx, s),
                                     out_shardings=self._canon_sh)
        self._to_stage = jax.jit(lambda s: to_stage_state(cfg, self.tx, s),
                                 out_shardings=shardings, donate_argnums=(0,))
        self._resumed = False
        self._failed: CheckpointError | None = None
        self._saved_any = False
        self._closed = False
        self._mngr = None

    @classmethod
    def from_config(cls, cfg: Config, shardings) -> "CheckpointManager":
        return cls(cfg, shardings)

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
                               META_ITEM: _MetaHandler()})
        return self._mngr

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
        meta = read_meta(where)
        if int(meta["step"]) != step:
            raise CheckpointError(f"checkpoint {where} is corrupt: its metadata says step "
                                  f"{meta['step']}")
        check_compatible(meta, self.cfg, str(where))
        try:
            restored = self._manager().restore(step, args=ocp.args.Composite(**{
                STATE_ITEM: ocp.args.StandardRestore(self._abstract)}))[STATE_ITEM]
        except Exception as e:      # orbax/tensorstore raise many kinds; one clear error
            self.close()
            raise CheckpointError(f"checkpoint {where} is corrupt or incomplete: "
                                  f"{type(e).__name__}: {_short(e)}") from e
        if int(restored["step"]) != step:
            raise CheckpointError(f"checkpoint {where} is corrupt: its state says step "
                                  f"{int(restored['step'])}")
        self._resumed = True
        return self._to_stage(restored)

    # -- save
    def _meta(self, step: int) -> dict:
        cfg = self.cfg
        d, p, t = cfg.parallel.mesh_shape
        tree = cfg.to_dict()
        return {
            "format": FORMAT, "version": VERSION, "step": int(step),
            "data": dict(data_state(step, cfg.train.global_batch_size),
                         seed=cfg.train.seed, paths=list(cfg.data.path),
                         weights=list(cfg.data.weights)),
            "rng": {"seed": cfg.train.seed,
                    "dropout_keys": "fold_in(fold_in(key(train.seed), step), global row)"},
            "config": json.loads(json.dumps(tree)),
            "layout": {"mesh": [d, p, t], "schedule": cfg.parallel.schedule,
                       "virtual_stages": cfg.parallel.virtual_stages},
            "param_shapes": _shape_tree(cfg.model),
            "time": time.time(),
        }

    def _drop_stale(self, step: int) -> None:
        """A run that did not resume owns the directory from its first save on:
        checkpoints left by an earlier run are removed (checkpoint.resume=false)."""
        for old in self.steps():
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
        """Start an asynchronous save of `state` as checkpoint `step`. Returns once
        the arrays are copied to host memory; the files are written in the
        background. Errors of an earlier save are raised here."""
        if self._closed:
            raise CheckpointError("save() after close()")
        if not self._saved_any and not self._resumed:
            self._drop_stale(step)
        canonical = self._to_canonical(state)
        if self._failed is not None:
            raise self._failed
        try:
            self._manager().save(step, args=ocp.args.Composite(**{
                STATE_ITEM: ocp.args.StandardSave(canonical),
                META_ITEM: _MetaSave(self._meta(step))}), force=True)
        except Exception as e:
            self._failed = self._write_error(e)
            raise self._failed from e
        self._saved_any = True

    def wait(self) -> None:
        """Block until every save in flight is written (and raise its error, if any,
        once)."""
        if self._mngr is not None and self._failed is None:
            try:
                self._mngr.wait_until_finished()
            except Exception as e:
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
        done = self.steps()
        prev = f"the previous checkpoint (step {done[-1]}) is intact" if done else \
            "no complete checkpoint was written"
        what = "disk full" if _is_enospc(e) else "write failed"
        return CheckpointError(f"checkpoint save to {self.directory} failed ({what}: "
                               f"{type(e).__name__}: {_short(e)}); {prev}")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _is_enospc(e: BaseException | None) -> bool:
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(e):
            return True
        e = e.__cause__ or e.__context__
        seen += 1
    return False


def _short(e: BaseException, limit: int = 300) -> str:
    s = str(e).strip().splitlines()
    s = s[0] if s else ""
    return s if len(s) <= limit else s[:limit] + " ..."


# ----------------------------------------------------------------------------- loading on the host

def resolve_step_dir(path: str | os.PathLike) -> Path:
    """A step directory, given either it or a checkpoint.dir (then its newest complete step)."""
    path = Path(os.path.expanduser(path)).absolute()
    if not path.is_dir():
        raise CheckpointError(f"checkpoint {path} does not exist or is not a directory")
    if (path / META_ITEM).is_dir() or (path / STATE_ITEM).is_dir():
        return path
    steps, _, _ = _scan(path)
    if not steps:
        raise CheckpointError(f"{path} holds no complete ptdp_jax checkpoint")
    return path / str(steps[-1])


def load_checkpoint(path: str | os.PathLike) -> tuple[Config, dict, dict]:
    """(config, canonical train state as host numpy arrays, metadata) of a checkpoint;
    `path` is a step directory or a checkpoint.dir (its newest complete step)."""
    from ptdp_jax.step import make_optimizer

    step_dir = resolve_step_dir(path)
    meta = read_meta(step_dir)
    cfg = _meta_config(meta, step_dir)
    tx, _ = make_optimizer(cfg)
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0]
                                            if _has_cpu() else jax.local_devices()[0])
    abstract = canonical_abstract_state(cfg, tx)
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dev), abstract)
    try:
        with ocp.StandardCheckpointer() as ckptr:
            state = ckptr.restore(step_dir / STATE_ITEM, target)
    except Exception as e:
        raise CheckpointError(f"checkpoint {step_dir} is corrupt or incomplete: "
                              f"{type(e).__name__}: {_short(e)}") from e
    return cfg, jax.tree.map(np.asarray, state), meta


def load_params(path: str | os.PathLike) -> tuple[Config, dict]:
    """(config, canonical parameters as host numpy arrays) of a checkpoint."""
    cfg, state, _ = load_checkpoint(path)
    return cfg, state["params"]


def stored_shapes(step_dir: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """'params/layers/qkv_w' -> shape, for every array stored in a step directory
    (from orbax's metadata; reads no array data)."""
    step_dir = Path(step_dir)
    with ocp.StandardCheckpointer() as ckptr:
        tree = ckptr.metadata(step_dir / STATE_ITEM).item_metadata
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(
            tree, is_leaf=lambda x: hasattr(x, "shape"))[0]:
        if hasattr(leaf, "shape"):
            out["/".join(_key_name(k) for k in path)] = tuple(leaf.shape)
    return out


def _key_name(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def _has_cpu() -> bool:
    try:
        return bool(jax.local_devices(backend="cpu"))
    except RuntimeError:
        return False


# ----------------------------------------------------------------------------- signals

class StopSignal:
    """Installs SIGTERM and SIGINT handlers that only set a flag (the training loop
    finishes its step, writes a checkpoint and exits). A second SIGINT raises
    KeyboardInterrupt at once. `restore()` puts the previous handlers back.
    Outside the main thread (where Python cannot install handlers) it does nothing.
    The flag is this process's; in a multi-process run the loop must agree on it
    across processes (train() does, once per step)."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, signals=SIGNALS):
        self.requested = False
        self.name = ""
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in signals:
            self._previous[sig] = signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            self.restore()
            raise KeyboardInterrupt
        self.requested = True
        self.name = signal.Signals(signum).name

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        self._previous = {}


__all__ = ["CheckpointError", "CheckpointManager", "StopSignal", "checkpoint_config",
           "load_checkpoint", "load_params", "read_meta", "resolve_step_dir", "stored_shapes", "to_canonical_state",
           "to_stage_state"]
