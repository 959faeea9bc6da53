"""A checkpoint's numerics against a config's: the settings that change what the same weights
compute (model.norm_eps, LLaMA's rope keys), not their shapes."""
from __future__ import annotations

from pathlib import Path

from ptdp_jax.checkpoint.format import CheckpointError, _meta_config, config_from_dict
from ptdp_jax.config.load import Config


ROPE_KEYS = ("rope_theta", "rope_scaling_factor", "rope_low_freq_factor",
             "rope_high_freq_factor", "rope_original_seq_len")


def _differences(src, m, keys) -> list[str]:
    """'model.KEY: checkpoint A, config B' for each of `keys` where the two models differ."""
    return [f"model.{k}: checkpoint {getattr(src, k)}, config {getattr(m, k)}"
            for k in keys if getattr(src, k) != getattr(m, k)]


def check_same_numerics(meta: dict, cfg: Config, where: str) -> None:
    """A resumed run computes the model it saved: CheckpointError naming model.norm_eps (and
    LLaMA's model.rope_* keys) where checkpoint and config differ; a deliberate change starts
    a new run from the weights (checkpoint.load_weights)."""
    src, m = _meta_config(meta, where).model, cfg.model
    keys = ("norm_eps",) + (ROPE_KEYS if m.arch == "llama" else ())
    diffs = _differences(src, m, keys)
    if diffs:
        raise CheckpointError(
            f"checkpoint {where} was trained as another model: {'; '.join(diffs)}. Resume "
            f"with the checkpoint's values, or start a new run from its weights with another "
            f"checkpoint.dir and checkpoint.load_weights={Path(where).parent}")


def check_numerics(meta: dict, cfg: Config, where: str) -> str:
    """CheckpointError naming model.norm_eps (and LLaMA's model.rope_* keys) where the source's
    differs from cfg's: not a shape, but the same weights would compute another model. A LLaMA
    run of a longer model.seq_len than the source's may change the rope keys (a context
    extension): returned in words ("model.seq_len 16 -> 64, model.rope_theta ..."), else ""."""
    src, m = config_from_dict(meta["config"]).model, cfg.model
    rope = ROPE_KEYS if m.arch == "llama" else ()
    longer = m.arch == "llama" and m.seq_len > src.seq_len
    keys = ("norm_eps",) + (() if longer else rope)
    diffs = _differences(src, m, keys)
    hint = (" (a longer model.seq_len than the checkpoint's may change the rope keys: a context "
            "extension, docs/long-context.md)" if any("rope" in d for d in diffs) else "")
    if diffs:
        raise CheckpointError(f"checkpoint {where} is of a different model: "
                              + "; ".join(diffs) + hint)
    if not longer:
        return ""
    changed = [k for k in ("seq_len",) + rope if getattr(src, k) != getattr(m, k)]
    return ", ".join(f"model.{k} {getattr(src, k)} -> {getattr(m, k)}" for k in changed)
