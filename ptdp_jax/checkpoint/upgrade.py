"""Checkpoints of an older format version, read by this one.

Version 1 stored GPT's attention input weight fused, `qkv_w` (L, h, 3, n, d) and `qkv_b`
(L, 3, n, d); version 2 stores `q_w`, `k_w`, `v_w` (L, h, n, d) and `q_b`, `k_b`, `v_b`
(L, n, d) (three GEMMs: no slicing of a fused output, which ran slower). A version-1
checkpoint is restored into the version-1 shapes and split, parameters and both AdamW
moments alike, so a run started before the change resumes where it stopped."""
from __future__ import annotations

from typing import Any

import jax
import numpy as np

FUSED = {"qkv_w": ("q_w", "k_w", "v_w"), "qkv_b": ("q_b", "k_b", "v_b")}


def _split_group(x) -> bool:      # a dict of layer tensors in the version-2 layout
    return isinstance(x, dict) and all(k in x for parts in FUSED.values() for k in parts)


def _fused_group(x) -> bool:      # the same in the version-1 layout
    return isinstance(x, dict) and all(k in x for k in FUSED)


def _fused_struct(q):
    """The version-1 ShapeDtypeStruct of three (..., n, d) parts: (..., 3, n, d)."""
    axis = len(q.shape) - 2
    shape = q.shape[:axis] + (3,) + q.shape[axis:]
    sharding = getattr(q, "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding):
        spec = list(sharding.spec) + [None] * (len(q.shape) - len(sharding.spec))
        sharding = jax.sharding.NamedSharding(sharding.mesh,
                                              jax.sharding.PartitionSpec(*spec[:axis], None,
                                                                         *spec[axis:]))
    return jax.ShapeDtypeStruct(shape, q.dtype, sharding=sharding)


def v1_abstract(tree: Any) -> Any:
    """A version-2 abstract train state (ShapeDtypeStructs) as version 1 stored it."""
    def fuse(group):
        if not _split_group(group):
            return group
        out = {k: v for k, v in group.items() if not any(k in p for p in FUSED.values())}
        for fused, parts in FUSED.items():
            out[fused] = _fused_struct(group[parts[0]])
        return out
    return jax.tree.map(fuse, tree, is_leaf=_split_group)


def from_v1(tree: Any, like: Any = None) -> Any:
    """A restored version-1 train state in the version-2 layout. like: the version-2 abstract
    state, whose shardings the split parts are placed with (None: arrays as they come)."""
    def split(group, like_group=None):
        if not _fused_group(group):
            return group
        out = {k: v for k, v in group.items() if k not in FUSED}
        for fused, parts in FUSED.items():
            x = group[fused]
            axis = x.ndim - 3
            for i, name in enumerate(parts):
                part = np.take(x, i, axis=axis) if isinstance(x, np.ndarray) else \
                    jax.numpy.take(x, i, axis=axis)
                sharding = getattr((like_group or {}).get(name), "sharding", None)
                out[name] = jax.device_put(part, sharding) if sharding is not None else part
        return out
    if like is None:
        return jax.tree.map(split, tree, is_leaf=_fused_group)
    return jax.tree.map(split, tree, like, is_leaf=_fused_group)


def v1_param_shapes(shapes: dict) -> dict:
    """Version-1 `param_shapes` metadata ({group: {name: [dims]}}) in the version-2 layout."""
    def split(group):
        if not isinstance(group, dict) or not _fused_group(group):
            return group
        out = {k: v for k, v in group.items() if k not in FUSED}
        for fused, parts in FUSED.items():
            dims = list(group[fused])
            axis = len(dims) - 3
            for name in parts:
                out[name] = dims[:axis] + dims[axis + 1:]
        return out
    return {k: split(v) for k, v in shapes.items()}
