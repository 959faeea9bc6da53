"""The manual mesh axes a value varies over inside a shard_map, for the regions that build
loop carries and sums (sharding.py, context.py)."""
from __future__ import annotations

import jax


def varying_axes(x) -> frozenset:
    """The manual mesh axes x varies over (jax 0.10: manual_axis_type; later: vma)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "manual_axis_type", None)
    return frozenset(mat.varying) if mat is not None else frozenset(getattr(aval, "vma", ()))


def vary_like(x, *refs):
    """x marked varying over the manual axes the refs (None: skipped) vary over (a loop's
    carry must keep one type)."""
    axes = frozenset().union(*(varying_axes(r) for r in refs if r is not None))
    return vary(x, tuple(sorted(axes)))


def vary(x, axes):
    """Mark x as varying over the given manual axes (those it is not varying over yet)."""
    missing = tuple(a for a in axes if a not in varying_axes(x))
    return jax.lax.pcast(x, missing, to="varying") if missing else x
