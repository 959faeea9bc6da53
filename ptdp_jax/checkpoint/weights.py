"""checkpoint.load_weights: a run that does not resume from its own checkpoint.dir starts from
the parameters of another model (Megatron's --finetune, torchtitan's initial_load_model_only,
MaxText's load_parameters_path): a ptdp_jax checkpoint (a checkpoint.dir: its newest step, or
one step directory) or a Hugging Face model folder (config.json and *.safetensors, read by
checkpoint/hf.py as ptdp-import-hf reads it). Only the parameters are read, never the
optimizer moments; the run starts at step 0 with fresh AdamW moments, on any mesh and schedule
(checkpoints hold the canonical layout).

    source = check_load_weights(cfg)             # before compiling: None, or what to read
    state = weights_state(source, cfg, compiled)  # after: the train state on the run's mesh
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import jax

from ptdp_jax.checkpoint import saving as SV
from ptdp_jax.checkpoint.format import (CheckpointError, _shape_tree, check_compatible,
                                        check_data_tokenizer, checkpoint_kind,
                                        read_meta, read_params, resolve_step_dir, run_tokenizer)
from ptdp_jax.checkpoint.hf import check_tensor_files, hf_model, import_hf
from ptdp_jax.checkpoint.numerics import check_numerics
from ptdp_jax.checkpoint.manager import resume_from
from ptdp_jax.config.load import Config, ConfigError, load_config
from ptdp_jax.training.state import (canonical_abstract_state, canonical_shardings,
                                     make_optimizer, state_from_params, with_shardings)

KEY = "checkpoint.load_weights"


@dataclass(frozen=True)
class WeightsSource:
    """What checkpoint.load_weights names, checked: a ptdp_jax step directory (with its
    metadata) or a Hugging Face model folder (meta None)."""
    path: Path
    meta: dict | None = None
    extended: str = ""          # a context extension's changes ("model.seq_len 16 -> 64, ...")

    def describe(self) -> str:
        what = (f"the Hugging Face model {self.path}" if self.meta is None else
                f"checkpoint {self.path} (step {self.meta['step']})")
        return what + (f" (context extended: {self.extended})" if self.extended else "")


def check_load_weights(cfg: Config) -> WeightsSource | None:
    """Before compiling: the source checkpoint.load_weights names, checked (readable, of
    cfg's model and of its data's tokenizer); None where it is unset or the run resumes from
    its checkpoint.dir (which then ignores it). ConfigError for a path that is missing or not
    a model; CheckpointError for one that cannot serve this run. Both name the key."""
    given = cfg.checkpoint.load_weights
    if not given or resume_from(cfg) is not None:
        return None
    path = _model_folder(given)
    with _named(given):
        if checkpoint_kind(path):
            return _checkpoint_source(path, cfg)
        return _hf_source(path, cfg)


def _model_folder(given: str) -> Path:
    """checkpoint.load_weights as an absolute folder that is a ptdp_jax checkpoint or holds a
    config.json; ConfigError otherwise."""
    path = Path(os.path.expanduser(given)).absolute()
    if not path.exists():
        raise ConfigError(f"{KEY}={given!r}: {path} does not exist")
    if not path.is_dir() or not (checkpoint_kind(path) or (path / "config.json").is_file()):
        raise ConfigError(f"{KEY}={given!r}: {path} is neither a ptdp_jax checkpoint (a "
                          f"checkpoint.dir or a step directory) nor a Hugging Face model folder "
                          f"(config.json and *.safetensors)")
    return path


@contextmanager
def _named(given: str):
    """CheckpointErrors (and the importer's ValueErrors) raised inside, prefixed with the key."""
    try:
        yield
    except ConfigError:
        raise
    except (CheckpointError, ValueError) as e:
        raise CheckpointError(f"{KEY}={given}: {e}") from None


def _checkpoint_source(path: Path, cfg: Config) -> WeightsSource:
    step_dir = resolve_step_dir(path)
    meta = read_meta(step_dir)
    check_compatible(meta, cfg, str(step_dir))
    extended = check_numerics(meta, cfg, str(step_dir))
    check_data_tokenizer(meta, step_dir, cfg, instead="")
    return WeightsSource(step_dir, meta, extended)


def _hf_source(path: Path, cfg: Config) -> WeightsSource:
    source = load_config(None, hf_model(path))
    check_tensor_files(path)
    like_meta = {"config": source.to_dict(), "param_shapes": _shape_tree(source.model)}
    try:
        check_compatible(like_meta, cfg, str(path))
    except CheckpointError as e:
        shorter = source.model.arch == "gpt" and cfg.model.seq_len < source.model.seq_len
        raise CheckpointError(str(e) + (
            f" (a GPT of fewer positions: `ptdp-import-hf {path} DIR model.seq_len="
            f"{cfg.model.seq_len}` cuts its position table; load the weights from DIR)"
            if shorter else "")) from None
    extended = check_numerics(like_meta, cfg, str(path))
    _check_hf_tokenizer(path, cfg)
    return WeightsSource(path, extended=extended)


def _check_hf_tokenizer(path: Path, cfg: Config) -> None:
    """CheckpointError where the folder's tokenizer.json gives other ids than the run's data."""
    from ptdp_jax.data.sources import same_ids
    tok, spec = path / "tokenizer.json", run_tokenizer(cfg)
    if not tok.is_file() or spec is None or same_ids(str(tok), spec):
        return
    data = f"data.path[0] = {cfg.data.path[0]!r}" if cfg.data.path else "the embedded corpus"
    raise CheckpointError(f"the model was trained on the token ids of {tok}, but {data} holds "
                          f"those of {spec!r}: the same ids mean other text. Use data prepared "
                          f"with its tokenizer (ptdp-prepare-data --tokenizer {path})")


def weights_state(source: WeightsSource, cfg: Config, compiled):
    """The train state of a run that starts from `source`'s parameters: step 0, fresh optimizer
    moments (and FP8 history), in the stage layout and shardings of `compiled` (step.Compiled)."""
    tx, _ = make_optimizer(cfg)
    mesh = compiled.shardings.step.mesh
    like = with_shardings(canonical_abstract_state(cfg, tx),
                          canonical_shardings(cfg, mesh, tx)).params
    if source.meta is not None:
        params = read_params(source.path, source.meta, like)
    else:
        params = _hf_params(source.path, like)
    state = jax.jit(lambda p: state_from_params(cfg, tx, p),
                    out_shardings=compiled.shardings)(params)
    SV.release(params)
    return state


def _hf_params(path: Path, like: dict) -> dict:
    """The canonical parameters of a Hugging Face folder, placed as `like` (each process
    puts the pieces of its own devices)."""
    with _named(str(path)):
        _, params = import_hf(path)
    return jax.tree.map(lambda x, a: jax.make_array_from_callback(
        x.shape, a.sharding, lambda index, x=x: x[index]), params, like)
