"""The head and loss of the pipeline, spread over every stage by vocabulary.

In lockstep the last stage's head (the logits GEMM, the cross-entropy and their backward:
about two layers' worth of work on a 1.3B GPT) would stretch every tick in which that stage
runs a forward. Instead, in such a tick every stage takes 1/p of the vocabulary: the last
chunk's output y is broadcast over 'pipe' (a psum of 1 message), each stage computes its
slice of the logits and their softmax statistics (`head_forward`), the statistics are
gathered over 'pipe' (a few (b, s) values, `combine_stats`), each stage takes the gradient
through its slice (`head_backward`), and the gradient with respect to y is summed over 'pipe'
(1 message) back to the last stage.

The executor runs the three collectives in every tick and the two halves in conditionals
that hold no collective: a conditional with a collective inside cannot be a CUDA-graph
node, so its predicate would go to the host every tick and stall the host's run-ahead.

The vocabulary slice of stage i is laid out to match 'tensor' sharding of the vocabulary:
viewing a (V, ...) table as (t, p, V/(t p), ...), stage i holds [:, i], so each device keeps
V/(t p) rows of its own tensor shard and nothing moves between tensor ranks.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from ptdp_jax.models import model as M


def spread_over_pipe(cfg) -> bool:
    """The head is split over the stages when the padded vocabulary divides by t * p."""
    par = cfg.parallel
    return par.pipe > 1 and cfg.model.padded_vocab_size % (par.pipe * par.tensor) == 0


class VocabSlices:
    """Slicing of the parameters that have a 'vocab' axis (embed and head groups)."""

    def __init__(self, cfg):
        self.p, self.t = cfg.parallel.pipe, cfg.parallel.tensor
        self.V = cfg.model.padded_vocab_size
        axes = M.param_logical_axes(cfg.model)
        self.vocab_axis = {g: {k: (names.index("vocab") if "vocab" in names else None)
                               for k, names in axes[g].items()} for g in ("embed", "head")}

    def _view(self, x, ax):
        """(..., V, ...) -> (..., t, p, V/(t p), ...) along axis ax."""
        return x.reshape(x.shape[:ax] + (self.t, self.p, self.V // (self.t * self.p))
                         + x.shape[ax + 1:])

    def take(self, groups, stage):
        """{'embed', 'head'} params -> the same with each 'vocab' axis cut to this stage's
        V/p entries (parameters without a vocab axis unchanged)."""
        def cut(x, ax):
            if ax is None:
                return x
            y = jax.lax.dynamic_index_in_dim(self._view(x, ax), stage, ax + 1, keepdims=False)
            return y.reshape(x.shape[:ax] + (self.V // self.p,) + x.shape[ax + 1:])
        return {g: {k: cut(x, self.vocab_axis[g][k]) for k, x in groups[g].items()}
                for g in groups}

    def put(self, sliced, stage):
        """Inverse placement: this stage's slices in full-size zeros (other rows zero), so
        that the sum over 'pipe' of every stage's result is the full gradient."""
        def place(x, ax):
            if ax is None:
                return x
            full = jnp.zeros(x.shape[:ax] + (self.V,) + x.shape[ax + 1:], x.dtype)
            part = x.reshape(x.shape[:ax] + (self.t, self.V // (self.t * self.p))
                             + x.shape[ax + 1:])
            view = jax.lax.dynamic_update_index_in_dim(
                self._view(full, ax), jnp.expand_dims(part, ax + 1), stage, ax + 1)
            return view.reshape(full.shape)
        return {g: {k: place(x, self.vocab_axis[g][k]) for k, x in sliced[g].items()}
                for g in sliced}

    def ids(self, stage):
        """(V/p,) vocabulary id of each column of this stage's logits."""
        vt, vtp = self.V // self.t, self.V // (self.t * self.p)
        r = jnp.arange(self.t, dtype=jnp.int32)[:, None]
        return (r * vt + stage * vtp + jnp.arange(vtp, dtype=jnp.int32)[None, :]).reshape(-1)


def head_forward(cfg, sh, groups, slices: VocabSlices, stage, y_bsh, targets_bs):
    """First half of one microbatch's head on this stage's vocabulary slice, with no
    collective over 'pipe' (so that it can run inside a conditional that XLA turns into a
    CUDA-graph node: no host round trip per tick).

    groups: {'embed', 'head'} compute-dtype params cut by `slices.take`; y_bsh: the last
    chunk's output (the same on every stage). Returns z (b, s, V/p) this slice's logits, in
    the compute dtype, and stats (3, b, s) float32: the slice's max logit, its sum of
    exp(logit - max) and its target logit (0 where the target is not in the slice)."""
    z = M.logits(cfg.model, sh, groups["embed"], groups["head"], y_bsh)
    zf = _masked(cfg, slices, stage, z)
    m_bs = zf.max(-1)
    s_bs = jnp.exp(zf - m_bs[..., None]).sum(-1)
    t_bs = jnp.where(slices.ids(stage) == targets_bs[..., None], zf, 0.0).sum(-1)
    return z, jnp.stack([m_bs, s_bs, t_bs])


def combine_stats(stats_p3bs):
    """(p, 3, b, s) every stage's stats (`head_forward`) -> (loss (b, s), lse (b, s)):
    the token losses and the log-sum-exp over the whole vocabulary."""
    m_p, s_p, t_p = stats_p3bs[:, 0], stats_p3bs[:, 1], stats_p3bs[:, 2]
    m_bs = m_p.max(0)
    lse_bs = jnp.log((s_p * jnp.exp(m_p - m_bs)).sum(0)) + m_bs
    return lse_bs - t_p.sum(0), lse_bs


def head_backward(cfg, sh, groups, slices: VocabSlices, stage, y_bsh, z_bsv, lse_bs,
                  targets_bs):
    """Second half, again without a collective over 'pipe': the gradient of the summed
    loss through this stage's slice. Returns (grads of groups (this stage's share),
    dy (b, s, h) this slice's part of the gradient of y: the sum over 'pipe' is the whole)."""
    zf = _masked(cfg, slices, stage, z_bsv)
    onehot = slices.ids(stage) == targets_bs[..., None]
    dz = jnp.exp(zf - lse_bs[..., None]) - onehot.astype(jnp.float32)   # softmax - onehot
    _, pull = jax.vjp(lambda g, y: M.logits(cfg.model, sh, g["embed"], g["head"], y),
                      groups, y_bsh)
    g, dy = pull(dz.astype(z_bsv.dtype))
    return g, dy


def _masked(cfg, slices, stage, z_bsv):
    """float32 logits with the padded vocabulary entries at the lowest float."""
    return jnp.where(slices.ids(stage) < cfg.model.vocab_size, z_bsv.astype(jnp.float32),
                     jnp.finfo(jnp.float32).min)
