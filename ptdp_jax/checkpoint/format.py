"""The on-disk format of checkpoints: metadata, the tokenizer item, compatibility checks,
directory scans and checks, and loading a checkpoint onto the host (export, inspection).
The canonical (mesh- and schedule-independent) layout of the train state is
ptdp_jax.training.state's; the manager that writes and restores checkpoints is ptdp_jax.checkpoint.manager."""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from ptdp_jax.checkpoint import upgrade as ckpt_upgrade
from ptdp_jax.config.load import Config, ConfigError, flatten, load_config
from ptdp_jax.paths import unwritable
from ptdp_jax.models import model as M
from ptdp_jax.training.state import (  # noqa: F401  (the train state's layouts live in ptdp_jax.training.state)
    canonical_abstract_state, canonical_shardings, make_optimizer, to_canonical_state,
    to_stage_state, with_shardings as _with_shardings)


FORMAT = "ptdp_jax-checkpoint"
VERSION = 2          # 2: GPT's q, k, v weights apart; 1 (fused QKV) is read too (ckpt_upgrade)
READABLE_VERSIONS = (1, 2)
META_FILE = "ptdp_meta.json"
STATE_ITEM, META_ITEM = "state", "meta"
TOKENIZER_ITEM = "tokenizer"     # a copy of the training data's tokenizer.json (BPE data)
LOCK_FILE = ".ptdp.lock"         # a training run's lock (checkpoint/lock.py); scans skip it
_TMP_MARK = ".orbax-checkpoint-tmp"
# Files orbax itself may keep at the top of a checkpoint directory.
_ORBAX_ROOT_FILES = {"_ROOT_METADATA", "descriptor", "_CHECKPOINT_METADATA"}


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be used (foreign, corrupt, another model)
    or a checkpoint that could not be written; the message says what and where."""




# ----------------------------------------------------------------------------- config in meta

def config_from_dict(tree: dict) -> Config:
    """A Config from the dict stored in a checkpoint (unknown keys are an error; keys of
    earlier versions load with one warning, config.migrate: never refused, the run is made)."""
    return _config_from_json(json.dumps(tree, sort_keys=True))


@functools.lru_cache(maxsize=32)
def _config_from_json(text: str) -> Config:
    """One load (and one warning) per saved config, however often a run reads it."""
    return load_config(None, flatten(json.loads(text)), strict=False,
                       origin="a checkpoint's saved config")


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
    if meta.get("version") not in READABLE_VERSIONS:
        raise CheckpointError(f"checkpoint {step_dir} has format version {meta.get('version')}, "
                              f"this ptdp_jax reads versions {list(READABLE_VERSIONS)}")
    for key in ("step", "config", "param_shapes"):
        if key not in meta:
            raise CheckpointError(f"checkpoint {step_dir} is corrupt: {path.name} lacks {key!r}")
    if meta["version"] == 1:        # compared with this version's shapes (check_compatible)
        meta = {**meta, "param_shapes": ckpt_upgrade.v1_param_shapes(meta["param_shapes"])}
    return meta


def step_meta(step_dir: str | os.PathLike, resuming: bool = False) -> dict:
    """read_meta of a step directory; where it fails for a step of a checkpoint.dir (no
    metadata, or unreadable), the CheckpointError says what damaged_message says of a damaged
    state: the newest older checkpoint, and how to use it instead."""
    try:
        return read_meta(step_dir)
    except CheckpointError as e:
        if _step_of(Path(step_dir).name) is None:
            raise
        raise CheckpointError(damaged_message(step_dir, e, resuming)) from None


def _meta_config(meta: dict, where) -> Config:
    try:
        return config_from_dict(meta["config"])
    except (ConfigError, TypeError, AttributeError) as e:
        raise CheckpointError(f"checkpoint {where}: its config cannot be read: {e}") from None


def checkpoint_config(step_dir: str | os.PathLike) -> Config:
    """The resolved config a checkpoint was written with."""
    return _meta_config(step_meta(step_dir), step_dir)


def _model_keys(m, seq_len: bool | None = None) -> dict[str, Any]:
    """The model settings that decide parameter shapes (and the model's identity); with
    model.seq_len for GPT (learned positions: a (seq_len, h) table), or if `seq_len`."""
    keys = {"model.arch": m.arch, "model.num_layers": m.num_layers,
            "model.hidden_size": m.hidden_size, "model.num_heads": m.num_heads,
            "model.num_kv_heads": m.kv_heads,
            "model.ffn_hidden_size": m.ffn, "model.vocab_size": m.vocab_size}
    if seq_len or (seq_len is None and m.arch == "gpt"):
        keys["model.seq_len"] = m.seq_len
    return keys


def _shape_tree(model_cfg) -> dict:
    return jax.tree.map(list, M.param_shapes(model_cfg), is_leaf=lambda x: isinstance(x, tuple))


def check_compatible(meta: dict, cfg: Config, where: str) -> None:
    """CheckpointError naming every model setting where checkpoint and config differ."""
    ck = _meta_config(meta, where)
    # the same keys, resolved, on both sides: a GPT checkpoint against a LLaMA config
    # compares model.seq_len too, read from both
    with_seq = "gpt" in (ck.model.arch, cfg.model.arch)
    a, b = _model_keys(ck.model, with_seq), _model_keys(cfg.model, with_seq)
    diffs = [f"{k}: checkpoint {a[k]}, config {b[k]}" for k in a if a[k] != b[k]]
    if not diffs and meta["param_shapes"] != _shape_tree(cfg.model):
        diffs.append("parameter shapes differ: checkpoint "
                     f"{meta['param_shapes']}, config {_shape_tree(cfg.model)}")
    if diffs:
        raise CheckpointError(f"checkpoint {where} is of a different model: " + "; ".join(diffs))


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


def checkpoint_kind(directory: Path) -> str | None:
    """What ptdp_jax checkpoint `directory` is, in words ('a ptdp_jax checkpoint.dir', 'a
    ptdp_jax step directory'), or None where it is none (or does not exist)."""
    if not directory.is_dir():
        return None
    if (directory / META_ITEM).is_dir() or (directory / STATE_ITEM).is_dir():
        return "a ptdp_jax step directory (checkpoint.dir/STEP)"
    steps, tmp, _ = _scan(directory)
    used = steps or tmp or (directory / LOCK_FILE).exists()
    return "a ptdp_jax checkpoint.dir" if used else None


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


def _short(e: BaseException, limit: int = 300) -> str:
    s = str(e).strip().splitlines()
    s = s[0] if s else ""
    return s if len(s) <= limit else s[:limit] + " ..."


def _read_error(e: BaseException, limit: int = 500) -> str:
    """What went wrong in a failed orbax/tensorstore read, on one line: the first error of
    the chain that is not a wrapper around a TensorStore repr, without tensorstore's
    driver and database prefixes and its spec."""
    chain = [e]
    while len(chain) < 20 and (chain[-1].__cause__ or chain[-1].__context__) is not None:
        chain.append(chain[-1].__cause__ or chain[-1].__context__)
    best = next((x for x in chain if "TensorStore details" not in str(x)), chain[-1])
    text = " ".join(str(best).split(" [tensorstore_spec")[0].split())
    text = re.sub(r'Error opening "\w+" driver: | in OCDBT database at local file "[^"]*"', "",
                  text)
    text = text if len(text) <= limit else text[:limit] + " ..."
    return f"{type(best).__name__}: {text}"


def damaged_message(step_dir: str | os.PathLike, e: BaseException, resuming: bool) -> str:
    """The CheckpointError text of a step directory that cannot be read: what failed, and
    the newest older checkpoint with how to use it instead (resuming: move the damaged one
    out of checkpoint.dir, since a run resumes from the newest)."""
    step_dir = Path(step_dir)
    directory, step = step_dir.parent, _step_of(step_dir.name)
    what = str(e) if isinstance(e, CheckpointError) else \
        f"checkpoint {step_dir} is corrupt or incomplete ({_read_error(e)})"
    older = None
    for s in reversed(_scan(directory)[0] if step is not None else []):
        try:
            if s < step:
                read_meta(directory / str(s))
                older = s
                break
        except CheckpointError:
            continue
    if older is None:
        return f"{what}; no older checkpoint is in {directory}" + \
            (f": move {step_dir} away and start fresh" if resuming else "")
    prev = directory / str(older)
    if resuming:
        return (f"{what}; the newest older checkpoint is step {older} ({prev}): to resume "
                f"from it, move {step_dir} out of checkpoint.dir (e.g. mv {step_dir} "
                f"{directory}-{step_dir.name}.damaged) and run again")
    return f"{what}; the newest older checkpoint is step {older}: give {prev} instead"


from ptdp_jax.checkpoint.quiet import quiet_closed_loop, quiet_orbax_errors  # noqa: E402,F401  (re-exported)


# ----------------------------------------------------------------------------- the tokenizer item

class _FilesHandler(ocp.JsonCheckpointHandler):
    """Text files ({name: text}) as one item, written by process 0 (the tokenizer)."""

    def __init__(self):
        super().__init__("tokenizer.json")

    async def _save_fn(self, x, directory):
        if jax.process_index() == 0:
            for name, text in x.items():
                (directory / name).write_text(text, encoding="utf-8")


@ocp.args.register_with_handler(_FilesHandler, for_save=True)
@dataclasses.dataclass
class _FilesSave(ocp.args.CheckpointArgs):
    item: dict


@ocp.args.register_with_handler(_FilesHandler, for_restore=True)
@dataclasses.dataclass
class _FilesRestore(ocp.args.CheckpointArgs):
    item: Any = None


def run_tokenizer(cfg: Config) -> str | None:
    """The tokenizer spec of a run's data ('byte' or a tokenizer.json); None if the data
    does not tell."""
    from ptdp_jax.data.sources import tokenizer_spec_of
    try:
        return tokenizer_spec_of(list(cfg.data.path))
    except ValueError:
        return None


def check_data_tokenizer(meta: dict, step_dir: Path, cfg: Config,
                         instead: str = ", or start a new run in another checkpoint.dir") -> None:
    """CheckpointError where cfg's data was tokenized by another tokenizer than the one the
    checkpoint's model learned (data.sources.same_ids): the same ids would mean other text.
    Silent where either side does not tell (a checkpoint without a tokenizer, data whose
    tokenizer file is gone). `instead`: the message's last advice."""
    from ptdp_jax.data.sources import same_ids
    kept = meta.get("tokenizer")
    if kept == "byte":
        name, copy = "byte", "byte"
    elif isinstance(kept, dict) and (step_dir / kept.get("file", "")).is_file():
        name, copy = str(kept.get("source", kept["file"])), str(step_dir / kept["file"])
    else:
        return
    for data, spec in _data_tokenizers(cfg):
        if spec is None or same_ids(copy, spec):
            continue
        raise CheckpointError(
            f"checkpoint {step_dir} was trained on the token ids of tokenizer {name!r}, but "
            f"{data} holds those of {spec!r}: the same ids mean other text. Use data prepared "
            f"with the checkpoint's tokenizer (ptdp-prepare-data --tokenizer {copy}){instead}")


def _data_tokenizers(cfg: Config) -> list[tuple[str, str | None]]:
    """(data.path[0] in words, its tokenizer spec), and data.val_path[0]'s where it is given;
    None where the data does not tell."""
    from ptdp_jax.data.sources import tokenizer_spec_of
    out = [(f"data.path[0] = {cfg.data.path[0]!r}" if cfg.data.path else "the embedded corpus",
            run_tokenizer(cfg))]
    if cfg.data.val_path:
        try:
            spec = tokenizer_spec_of(list(cfg.data.val_path))
        except ValueError:
            spec = None
        out.append((f"data.val_path[0] = {cfg.data.val_path[0]!r}", spec))
    return out


def tokenizer_files(spec: str | None) -> dict[str, str]:
    """{name: text} kept in a checkpoint for tokenizer `spec`: nothing for 'byte' (the
    metadata says it), a tokenizer.json with the tokenizer_config.json beside it if any."""
    if spec is None or spec == "byte":
        return {}
    path = Path(spec)
    files = {"tokenizer.json": path.read_text(encoding="utf-8")}
    conf = path.with_name("tokenizer_config.json")
    if path.name == "tokenizer.json" and conf.is_file():
        files[conf.name] = conf.read_text(encoding="utf-8")
    return files


# ----------------------------------------------------------------------------- writable

def _check_writable(directory: Path) -> None:
    """CheckpointError unless files can be made in `directory` (paths.unwritable)."""
    why = unwritable(directory)
    if why:
        raise CheckpointError(f"checkpoint.dir {directory} {why}")


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
    `path` is a step directory or a checkpoint.dir (its newest complete step). The state is
    the tree as stored ({'params', 'opt', 'step', 'bad_steps'}: `TrainState.as_dict`)."""
    step_dir = resolve_step_dir(path)
    meta = step_meta(step_dir)
    cfg = _meta_config(meta, step_dir)
    tx, _ = make_optimizer(cfg)
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0]
                                            if _has_cpu() else jax.local_devices()[0])
    abstract = canonical_abstract_state(cfg, tx).as_dict()
    target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dev), abstract)
    if meta["version"] == 1:
        target = ckpt_upgrade.v1_abstract(target)
    quiet_closed_loop()
    try:
        with ocp.StandardCheckpointer() as ckptr:
            state = ckptr.restore(step_dir / STATE_ITEM, target)
    except Exception as e:
        raise CheckpointError(damaged_message(step_dir, e, resuming=False)) from e
    state = jax.tree.map(np.asarray, state)
    if meta["version"] == 1:
        state = ckpt_upgrade.from_v1(state)
    return cfg, state, meta


def checkpoint_tokenizer(path: str | os.PathLike) -> tuple[str, str] | None:
    """(spec for load_tokenizer, the name it had in training) of the tokenizer kept in a
    checkpoint: 'byte', or the copy of a tokenizer.json in its step directory; None for a
    checkpoint that keeps none (older ones, imports without a usable tokenizer)."""
    step_dir = resolve_step_dir(path)
    kept = step_meta(step_dir).get("tokenizer")
    if kept == "byte":
        return "byte", "byte"
    if isinstance(kept, dict) and (step_dir / kept.get("file", "")).is_file():
        return str(step_dir / kept["file"]), str(kept.get("source", kept["file"]))
    return None


def load_params(path: str | os.PathLike) -> tuple[Config, dict]:
    """(config, canonical parameters as host numpy arrays) of a checkpoint (a step directory
    or a checkpoint.dir: its newest); reads the parameters alone, not the optimizer moments."""
    step_dir = resolve_step_dir(path)
    meta = read_meta(step_dir)
    cfg = _meta_config(meta, step_dir)
    dev = jax.sharding.SingleDeviceSharding(jax.local_devices(backend="cpu")[0]
                                            if _has_cpu() else jax.local_devices()[0])
    like = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=dev),
                        jax.eval_shape(lambda: M.init_params(cfg.model, 0)))
    return cfg, jax.tree.map(np.asarray, read_params(step_dir, meta, like))


def read_params(step_dir: Path, meta: dict, like: dict) -> dict:
    """The canonical parameters of a step directory, read alone (the optimizer moments are not
    read, so a damaged moment does not matter), onto `like`'s shardings (ShapeDtypeStructs in
    the canonical layout). CheckpointError naming the step directory if they cannot be read."""
    old = meta["version"] == 1          # GPT's fused QKV: read fused, then split
    item = {"params": ckpt_upgrade.v1_abstract(like) if old else like}
    quiet_closed_loop()
    try:
        with ocp.PyTreeCheckpointer() as ckptr:
            params = ckptr.restore(step_dir / STATE_ITEM, args=ocp.args.PyTreeRestore(
                item=item, restore_args=ocp.checkpoint_utils.construct_restore_args(item),
                partial_restore=True))["params"]
    except Exception as e:      # orbax/tensorstore raise many kinds; one clear error
        raise CheckpointError(damaged_message(step_dir, e, resuming=False)) from e
    return ckpt_upgrade.from_v1(params, like=like) if old else params


def stored_shapes(step_dir: str | os.PathLike) -> dict[str, tuple[int, ...]]:
    """'params/layers/q_w' -> shape, for every array stored in a step directory
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
