"""The head and loss of the pipeline, spread over every stage by vocabulary.

In lockstep the last stage's head (the logits GEMM, the cross-entropy and their backward:
about two layers' worth of work on a 1.3B GPT) would stretch every tick in which that stage
runs a forward. Instead, in such a tick every stage takes 1/p of the vocabulary: the last
chunk's output y is broadcast over 'pipe' (a psum of 1 message), each stage computes its
slice of the logits, the softmax statistics are reduced over 'pipe' (a few (b, s) values),
and the gradient with respect to y is summed over 'pipe' (1 message) back to the last stage.
"The last stage" is the last chunk's stage throughout: p - 1, or stage 0 under ZB-V, whose V
brings the last chunk back to the first stage (the caller says which, `is_last`).

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


def head_over_pipe(cfg, sh, groups, slices: VocabSlices, stage, y_bsh, is_last, targets_bs):
    """Loss and gradients of one microbatch's head, every stage taking its vocabulary slice.

    groups: {'embed', 'head'} compute-dtype params cut by `slices.take`; y_bsh: the last
    chunk's output, valid on the last chunk's stage (`is_last`). Returns (loss, grads of groups
    (this stage's share), dy (the full gradient of y, on every stage))."""
    y = _broadcast_from(sh, y_bsh, is_last)
    ids = slices.ids(stage)

    def loss_fn(g, y_):
        return M.head_loss(cfg.model, sh, g["embed"], g["head"], y_, targets_bs, ids, "pipe")
    loss, (g, dy) = jax.value_and_grad(loss_fn, argnums=(0, 1))(groups, y)
    return loss, g, dy


def _broadcast_from(sh, x, is_source):
    """x of the stage where `is_source`, on every stage: a psum over 'pipe' of one nonzero term,
    so exact in any dtype. On CPU devices it is summed in float32: XLA:CPU's AllReducePromotion
    aborts the process on a bfloat16 all-reduce in a region not manual over 'tensor'
    (it fails to clone the reducer); GPUs keep the compute dtype (half the bytes)."""
    on_cpu = sh.mesh is not None and sh.mesh.devices.flat[0].platform == "cpu"
    wide = on_cpu and x.dtype in (jnp.bfloat16, jnp.float16)
    y = jnp.where(is_source, x, jnp.zeros_like(x)).astype(jnp.float32 if wide else x.dtype)
    return jax.lax.psum(y, "pipe").astype(x.dtype)
