"""A `jax.vjp` pullback as arrays that can cross a boundary (a scan carry, a shard_map's
outputs) and be made into a pullback again in another trace."""
from __future__ import annotations

import jax


class Residuals:
    """Flattens a pullback into (leaves to keep, leaves the caller still has: `known`, e.g. the
    weights or the inputs, matched by identity), and joins them back."""

    def __init__(self):
        self.treedef = None
        self.from_known = None       # per leaf: index into the known leaves, or -1

    def split(self, pullback, known) -> list:
        leaves, treedef = jax.tree.flatten(pullback)
        ids = {id(a): i for i, a in enumerate(jax.tree.leaves(known))}
        from_known = tuple(ids.get(id(a), -1) for a in leaves)
        if self.treedef is None:
            self.treedef, self.from_known = treedef, from_known
        # The same function traced again gives the same pullback structure; only the
        # residual values differ.
        assert from_known == self.from_known, "residual structure changed between traces"
        return [a for a, k in zip(leaves, from_known) if k < 0]

    def join(self, kept, known):
        kl = jax.tree.leaves(known)
        it = iter(kept)
        leaves = [next(it) if k < 0 else kl[k] for k in self.from_known]
        return jax.tree.unflatten(self.treedef, leaves)
