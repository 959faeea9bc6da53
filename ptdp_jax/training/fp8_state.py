"""Delayed FP8 scaling's state (train.fp8=true, train.fp8_recipe=delayed).

For each layer and GEMM weight w the train state keeps `fp8_<w>`: (L, 2, H) float32, the scales
that the GEMM's input x and its output gradient dy needed in each of the last H =
train.fp8_amax_history steps (newest first; 0: no step yet). A step rounds x and dy at the
largest of them (models/fp8.py, delayed scaling), so the rounding needs no pass over the
tensor first; the step's own needs come back through the gradient path and enter the history.

    history = init_history(cfg)                # canonical, all zeros: each tensor's own scale
    rows = meta_rows(history)                  # what each GEMM gets: one-hot exponent rows
    history = update(history, seen, finite)    # after the step; a non-finite step changes nothing

Once every row holds a scale (steady_ready), the train loop runs a second compiled step that
rounds at the history's scale without first reducing the tensor (Sharder.fp8_steady): the same
numbers, one pass over each operand fewer.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ptdp_jax.models import fp8 as F8
from ptdp_jax.models import model as M
from ptdp_jax.models.layers import META_PREFIX
from ptdp_jax.parallel.sharding import STACK_AXES

TAIL_AXES = (None, None)      # (operand: x or dy, history step / exponent bin): replicated


def delayed(cfg) -> bool:
    """Whether the step keeps an amax history (FP8 with the delayed recipe)."""
    return bool(cfg.train.fp8) and cfg.train.fp8_recipe == "delayed"


def steady_possible(cfg) -> bool:
    """Whether a steady step can ever run (steady_ready needs a history of two steps or more)."""
    return delayed(cfg) and cfg.train.fp8_amax_history >= 2


def meta_names(cfg) -> tuple[str, ...]:
    """The layer-params keys of the GEMMs' rows, one per GEMM weight."""
    return tuple(META_PREFIX + w for w in M.dense_weight_names(cfg.model))


def logical_axes(cfg, stage_layout: bool = True) -> dict:
    """{key: logical names} of the history (and of the rows): the layer stack's, then two
    replicated dims."""
    lead = STACK_AXES if stage_layout else ("layers",)
    return {k: lead + TAIL_AXES for k in meta_names(cfg)}


def init_history(cfg) -> dict:
    """The canonical history of a fresh run: {fp8_<w>: (L, 2, H) zeros}."""
    shape = (cfg.model.num_layers, 2, cfg.train.fp8_amax_history)
    return {k: jnp.zeros(shape, jnp.float32) for k in meta_names(cfg)}


def meta_rows(history: dict) -> dict:
    """{key: (..., 2, H) scales} -> {key: (..., 2, NBINS)} one-hot rows of the exponent of each
    operand's largest scale (zeros where there is none yet: the tensor's own scale)."""
    def rows(h):
        s = h.max(-1)
        e = jnp.clip(F8.exponent(jnp.where(s > 0, s, 1.0)) - F8.E_MIN, 0, F8.NBINS - 1)
        return jnp.where((s > 0)[..., None], jax.nn.one_hot(e, F8.NBINS), 0.0)
    return {k: rows(h) for k, h in history.items()}


def update(history: dict, seen: dict, finite) -> dict:
    """The history after a step. seen {key: (..., 2, NBINS)}: per exponent, how many GEMM calls
    (microbatches, replicas) needed it (scaled by any positive factor); the highest such
    exponent's scale enters in front and the oldest leaves. Unchanged where not `finite`."""
    def one(h, c):
        top = jnp.max(jnp.where(c > 0, jnp.arange(F8.NBINS), -1), axis=-1)
        s = jnp.where(top >= 0, F8.two_to(top + F8.E_MIN), 0.0)
        new = jnp.concatenate([s[..., None].astype(h.dtype), h[..., :-1]], axis=-1)
        return jnp.where(finite, new, h)
    return {k: one(h, seen[k]) for k, h in history.items()}


READY_METRIC = "fp8_steady_ready"     # the train step's metric of steady_ready


def steady_ready(history: dict):
    """Whether the step after next may run steady (models/fp8.scale_from_bins without the own-
    scale fallback): every row holds a scale in its newest H - 1 entries, so one more step,
    which drops the oldest, still leaves one. A loop that reads a step's metrics one step late
    can switch on it. Always False with a history of one step."""
    if not history or next(iter(history.values())).shape[-1] < 2:
        return jnp.bool_(False)
    return jnp.all(jnp.stack([jnp.all(h[..., :-1].max(-1) > 0) for h in history.values()]))


def stored_abstract(cfg_saved, sharding) -> dict | None:
    """ShapeDtypeStructs of the canonical history a checkpoint written under cfg_saved holds
    (None: its run kept none)."""
    if not delayed(cfg_saved):
        return None
    shape = (cfg_saved.model.num_layers, 2, cfg_saved.train.fp8_amax_history)
    return {k: jax.ShapeDtypeStruct(shape, jnp.float32, sharding=sharding)
            for k in meta_names(cfg_saved)}


def for_config(cfg, history: dict | None) -> dict | None:
    """A restored canonical history made fit for cfg: dropped where cfg keeps none, fresh where
    the checkpoint had none, cut or padded (no history: zeros) to train.fp8_amax_history."""
    if not delayed(cfg):
        return None
    if history is None:
        return init_history(cfg)
    h_len = cfg.train.fp8_amax_history

    def fit(h):
        h = h[..., :h_len]
        return jnp.pad(h, [(0, 0)] * (h.ndim - 1) + [(0, h_len - h.shape[-1])])
    return {k: fit(h) for k, h in history.items()}
