"""Keys of earlier versions (MOVED, GONE, FIXED): `migrate` gives their new names, one
ConfigWarning a config says what replaced them, and a value that can no longer be honoured is a
ConfigError naming the key."""
from __future__ import annotations

import os
from typing import Any, Mapping

from ptdp_jax.config import decisions as D
from ptdp_jax.config.schema import ConfigError, TrainConfig


class ConfigWarning(UserWarning):
    """A config that names keys of an earlier version: what replaced them."""


# Keys that moved: the value is carried to the new key.
MOVED = {
    "model.attention": "tuning.attention",
    "train.keep_ffn_activation": "tuning.keep_ffn_activation",
    "train.scan_layers": "tuning.scan_layers",
    "train.skip_memory_check": "tuning.skip_memory_check",
    "parallel.static_stash": "tuning.static_stash",
    "parallel.overlap_grad_reduce": "tuning.overlap_grad_reduce",
    "parallel.tp_comm_overlap": "tuning.tp_comm_overlap",
    "parallel.allow_cross_host_tensor": "tuning.allow_cross_host_tensor",
}
# Keys whose every value gave the same results: what the code does now instead.
GONE = {
    "parallel.empty_buffers": "buffers start empty where tensor is 1 (decisions.empty_buffers)",
    "parallel.overlap_p2p": "the phased schedules overlap their messages (decisions.overlap_p2p)",
    "train.dispatch_ahead": "the loop always dispatches the next step before reading the last",
    "parallel.zero_ring": "ZeRO's collectives are NCCL's (the rings measured +2.9%)",
    "parallel.tp_overlap_sends": "the tensor ring sends each block straight to every rank",
    "parallel.nccl_channels": "64 NCCL channels with tensor > 1 (decisions.nccl_environment); "
                              "NCCL_MIN_NCHANNELS in the environment overrides it",
    "run.progress": "a progress bar on a terminal, lines otherwise (decisions.progress_bar)",
    "run.tensorboard": "TensorBoard events where tensorboardX is installed",
}
# Keys fixed to one value now: another can no longer be honoured (a ConfigError).
FIXED = {
    "train.max_bad_steps": (D.MAX_BAD_STEPS, f"a run stops after {D.MAX_BAD_STEPS} non-finite "
                                             f"steps in a row"),
    "data.cache_dir": ("~/.cache/ptdp_jax", "the embedded corpus is cached in $PTDP_CACHE_DIR "
                                            "(default ~/.cache/ptdp_jax): set that instead"),
    "train.sample_prompt": (D.SAMPLE_PROMPT, "the end-of-run sample starts from 'The ' "
                                             "(ptdp-generate CHECKPOINT --prompt ... for another)"),
    "train.sample_temperature": (D.SAMPLE_TEMPERATURE, "the end-of-run sample is at temperature "
                                                       "0.6, top-k 20 (ptdp-generate for others)"),
    "train.sample_top_k": (D.SAMPLE_TOP_K, "the end-of-run sample is at temperature 0.6, top-k 20 "
                                           "(ptdp-generate for others)"),
}
BETAS = ("train.beta1", "train.beta2")


def _same(value, now) -> bool:
    try:
        return value == now or (isinstance(now, str) and os.path.expanduser(str(value))
                                == os.path.expanduser(now))
    except TypeError:
        return False


def migrate(flat: Mapping[str, Any], strict: bool = True,
            where=lambda key: "") -> tuple[dict[str, Any], list[str]]:
    """(flat with the keys of earlier versions replaced, a note for each). strict: a value
    that can no longer be honoured is a ConfigError naming the key (a file or an override);
    otherwise it is left out with its note (a checkpoint's saved config)."""
    out, notes = {}, []
    for key, value in flat.items():
        if key in MOVED:
            out.setdefault(MOVED[key], value)
            notes.append(f"{key} is now {MOVED[key]}")
        elif key in GONE:
            notes.append(f"{key} is gone: {GONE[key]}")
        elif key in FIXED:
            now, why = FIXED[key]
            if strict and value is not None and not _same(value, now):
                raise ConfigError(f"{where(key)}{key}={value!r} can no longer be set: {why}")
            notes.append(f"{key} is gone: {why}")
        elif key not in BETAS and key != "checkpoint.overwrite":
            out[key] = value
    _merge_betas(flat, out, notes)
    _merge_overwrite(flat, out, notes)
    return out, notes


def _merge_betas(flat, out, notes) -> None:
    if not any(k in flat for k in BETAS):
        return
    default = TrainConfig().adam_betas
    if "train.adam_betas" not in out:
        out["train.adam_betas"] = [d if flat.get(k) is None else flat[k]
                                   for k, d in zip(BETAS, default)]
    notes.append("train.beta1 and train.beta2 are now train.adam_betas: [beta1, beta2]")


def _merge_overwrite(flat, out, notes) -> None:
    if "checkpoint.overwrite" not in flat:
        return
    if str(flat["checkpoint.overwrite"]).lower() in ("true", "1", "yes", "on") and \
            str(out.get("checkpoint.resume", True)).lower() in ("false", "0", "no", "off"):
        out["checkpoint.resume"] = "overwrite"
    notes.append("checkpoint.overwrite=true is now checkpoint.resume=overwrite")


def warn_old_keys(notes: list[str], what: str) -> None:
    """One warning for a config's keys of earlier versions."""
    if notes:
        import warnings
        warnings.warn(ConfigWarning(f"{what}: keys of an earlier version: " + "; ".join(notes)),
                      stacklevel=4)
