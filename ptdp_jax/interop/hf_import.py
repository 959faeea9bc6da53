"""`ptdp-import-hf HF_DIR CHECKPOINT_DIR [key=value ...]`: a Hugging Face GPT-2 or
LLaMA directory (config.json + *.safetensors) as a ptdp_jax checkpoint at step 0.

The inverse of ptdp_jax.interop.export. Beside the checkpoint it writes CHECKPOINT_DIR.yaml (the
model.* settings and checkpoint.dir), so that training continues from it with one command:

    ptdp-import-hf ./gpt2-small ckpt/            # writes ckpt/0 and ckpt.yaml
    ptdp-train ckpt.yaml --mesh 2,2,2 train.lr=1e-4 data.path=[data/mycorpus]

The checkpoint holds the parameters (vocabulary padded to a multiple of 128 with
zero rows), a fresh optimizer state, step 0, and the config: the model settings
read from config.json. Overrides: model.dropout and model.init_std
are taken; model.seq_len may be shortened (GPT: the position table is cut); any other
model.* key must agree with config.json, and train.*, data.*, parallel.*, ... belong
to ptdp-train (which does not read them from the checkpoint): each of those is a
ConfigError naming it, and nothing is written (nor if CHECKPOINT_DIR.yaml exists). Supported: GPT2LMHeadModel with gelu_new
and tied embeddings; LlamaForCausalLM, with grouped-query attention
(num_key_value_heads) and LLaMA-3.1's rope scaling (rope_type llama3: the model.rope_*
keys), without biases. Anything else (another rope_type too) is a ValueError naming the setting.

    ptdp-import-hf ./llama ckpt/ model.dropout=0.1
    ptdp-train ckpt.yaml train.lr=1e-4
"""
from __future__ import annotations

import os
from pathlib import Path

from ptdp_jax.checkpoint.hf import (  # noqa: F401  (re-exported: the importer's readers)
    CONVERTERS, check_tensor_files, gpt_from_hf, gpt_model, hf_model, import_hf, llama_from_hf,
    llama_model)
from ptdp_jax.config.load import ConfigError, load_config
from ptdp_jax.paths import unwritable


FREE_MODEL_KEYS = ("model.dropout", "model.init_std")


def import_config(model: dict, overrides: dict, params: dict):
    """(Config, params) of an import: the model settings of config.json with the
    overrides that can be honoured (see the module doc); ConfigError for the others."""
    from ptdp_jax.config.load import _apply, Config, migrate
    source = load_config(None, model)
    overrides = migrate(overrides)[0]            # keys of earlier versions: their new names
    refused = []
    for key, value in overrides.items():
        section = key.split(".", 1)[0]
        if section != "model":
            try:
                _apply(Config(), {key: value})
            except ConfigError as e:
                raise ConfigError(str(e)) from None
            refused.append(f"{key}: ptdp-import-hf writes the model only and ptdp-train does "
                           f"not read {section}.* from a checkpoint; give it to ptdp-train")
            continue
        got = getattr(load_config(None, {**model, key: value}).model, key.split(".", 1)[1])
        want = getattr(source.model, key.split(".", 1)[1])
        if key in FREE_MODEL_KEYS or got == want:
            continue
        if key == "model.seq_len" and (source.model.arch == "llama" or got <= want):
            continue
        if key == "model.seq_len":
            refused.append(f"model.seq_len={got}: the source has {want} learned positions; it "
                           f"can only be shortened")
        elif key in model:
            refused.append(f"{key}={got}: the source ({key.split('.')[1]} from config.json) has "
                           f"{want}; a converted model keeps the source's shape")
        else:
            refused.append(f"{key}={got}: not a setting a converted model can change (only "
                           f"{', '.join(FREE_MODEL_KEYS)} and a shorter model.seq_len)")
    if refused:
        raise ConfigError("ptdp-import-hf cannot honour " + "; ".join(refused))
    cfg = load_config(None, {**model, **overrides})
    if cfg.model.arch == "gpt" and cfg.model.seq_len < source.model.seq_len:
        params = dict(params, embed=dict(params["embed"],
                                         wpe=params["embed"]["wpe"][: cfg.model.seq_len]))
    return cfg, params


def hf_tokenizer(hf_dir: str | os.PathLike, vocab_size: int) -> str | None:
    """The source's tokenizer.json where ptdp_jax can use it (an end-of-document token,
    no more ids than the model), else None."""
    from ptdp_jax.data.tokenizer import load_tokenizer
    path = Path(hf_dir) / "tokenizer.json"
    if not path.is_file():
        return None
    try:
        tok = load_tokenizer(str(path))
    except Exception:               # tokenizers raises plain Exceptions for a file it rejects
        return None
    return str(path.resolve()) if tok.vocab_size <= vocab_size else None


def write_checkpoint(cfg, params, directory: str | os.PathLike,
                     tokenizer: str | None = None) -> Path:
    """A step-0 checkpoint of canonical `params` (fresh optimizer state) in `directory`,
    keeping `tokenizer` (a tokenizer.json, or None)."""
    import jax
    import jax.numpy as jnp
    from dataclasses import replace

    from ptdp_jax.checkpoint.manager import CheckpointManager
    from ptdp_jax.parallel.sharding import make_mesh
    from ptdp_jax.training.state import make_optimizer, state_from_params, state_shardings

    cfg = replace(cfg, parallel=replace(cfg.parallel, data=1, pipe=1, tensor=1,
                                        schedule="1f1b", virtual_stages=1),
                  checkpoint=replace(cfg.checkpoint, dir=str(directory), resume=False))
    tx, _ = make_optimizer(cfg)
    shardings = state_shardings(cfg, make_mesh((1, 1, 1)), tx)
    manager = CheckpointManager(cfg, shardings)
    manager.tokenizer = tokenizer
    if manager.steps():
        raise ValueError(f"{directory} already holds checkpoints (steps {manager.steps()}); "
                         f"import into a new or empty directory")
    state = jax.jit(lambda prm: state_from_params(cfg, tx, prm), out_shardings=shardings)(
        jax.tree.map(jnp.asarray, params))
    with manager:
        manager.save(0, state)
    return Path(directory) / "0"


def check_destination(checkpoint_dir: str | os.PathLike) -> None:
    """Before anything is read: ValueError naming the folder where CHECKPOINT_DIR, or the
    CHECKPOINT_DIR.yaml beside it, cannot be written (paths.unwritable), or that YAML exists."""
    yaml_path = config_path(checkpoint_dir)
    if yaml_path.exists():
        raise ValueError(f"{yaml_path} exists; ptdp-import-hf writes the model's config "
                         f"there: move it away, or import into another directory")
    for folder in (Path(os.path.expanduser(checkpoint_dir)).absolute(), yaml_path.parent):
        why = unwritable(folder)
        if why:
            raise ValueError(f"{checkpoint_dir}: {folder} {why}")


def config_path(checkpoint_dir: str | os.PathLike) -> Path:
    """The YAML file written beside an imported checkpoint: CHECKPOINT_DIR.yaml."""
    d = Path(os.path.expanduser(checkpoint_dir)).absolute()
    return d.with_name(d.name + ".yaml")


def write_config(model: dict, overrides: dict, checkpoint_dir, hf_dir) -> Path:
    """CHECKPOINT_DIR.yaml: the model.* settings of the import and the absolute
    checkpoint.dir; `ptdp-train` of it resumes from the imported step 0."""
    import yaml
    settings = {k.split(".", 1)[1]: v for k, v in {**model, **overrides}.items()
                if k.startswith("model.")}
    tree = {"model": settings,
            "checkpoint": {"dir": str(Path(os.path.expanduser(checkpoint_dir)).absolute())}}
    path = config_path(checkpoint_dir)
    path.write_text(f"# ptdp-import-hf {hf_dir}: the model of this checkpoint; add train.*, "
                    f"data.* and --mesh\n" + yaml.safe_dump(tree, sort_keys=False))
    return path


def _shown(path: Path) -> str:
    """`path` relative to the working directory where it lies below it, else absolute."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
