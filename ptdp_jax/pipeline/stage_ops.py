"""The ops a stage runs in a tick: the branches of the tick's `lax.switch` (idle, a forward,
a backward or a backward half of one model chunk, a zero-bubble B or W) and the head over the
pipe that runs after the switch. Each is a function (PipeState, TickControl) -> PipeState that
updates, in place, one slot of the buffers it owns and leaves the others alone (no copy).

Branches are specialised per (op, virtual chunk, layer count, first / last chunk; with the
static stash, slot), so a chunk's layers are unrolled with their weights as loop constants: no
per-tick weight slicing, no scan inside a tick. Backward uses `jax.vjp` per layer; a layer's
residuals (without the weights) go through the stash between its forward and its backward.
Gradients accumulate in float32: the GEMM weights are (compute copy, float32 master) pairs, so
their gradients come out of the GEMM in float32 and go straight into the sums (models/dense.py).

How a backward yields its weight gradients is one of two strategies, chosen once a step:

    WholeBackward   tables without W ops: the vjp gives them
    SplitBackward   tables with W ops (zero bubble): the GEMM weights get zero taps whose
                    "gradients" are the GEMM inputs and output gradients; B stores them in the
                    W stash, W turns them into weight gradients (a whole backward in such a
                    table, zb-phased's, does both at once)
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from ptdp_jax.models import model as M
from ptdp_jax.models.dense import Taps, tap_structs, weight_grad
from ptdp_jax.models.layers import Rows
from ptdp_jax.models.residuals import Residuals
from ptdp_jax.pipeline import schedule as S
from ptdp_jax.pipeline.head import VocabSlices, head_over_pipe
from ptdp_jax.pipeline.host_stash import HostStash
from ptdp_jax.pipeline.pipe_state import PipeState, f32_add, grads_of
from ptdp_jax.pipeline.routing import Branch, TickControl
from ptdp_jax.pipeline.stash import IndexedStash, StaticStash, map_entry
from ptdp_jax.parallel.sharding import vary

Store = IndexedStash | StaticStash


class WholeBackward:
    """Tables without W ops: the layer's vjp gives its weight gradients."""

    def vjp_weights(self, layer_w: dict) -> dict:
        return layer_w

    def weight_grads(self, w_grads: dict, wstash, branch, ctl, layer: int, part: int):
        return w_grads, wstash


@dataclass(frozen=True)
class SplitBackward:
    """Tables with W ops. dense: the GEMM weights' names (models.model.dense_weight_names);
    gemm_shapes: {GEMM weight: (x shape, dy shape)} of one layer."""
    dense: tuple
    gemm_shapes: dict
    dtype: Any
    manual: tuple
    fp8: bool
    store: Store                      # the W stash's

    def vjp_weights(self, layer_w: dict) -> dict:
        """The weights a layer's vjp is taken against: zero taps on the GEMM weights."""
        zeros = lambda sd: vary(jnp.zeros(sd.shape, sd.dtype), self.manual)
        return {k: Taps(a.w, *map_entry(zeros, self.taps(k))) if k in self.dense else a
                for k, a in layer_w.items()}

    def taps(self, k: str):
        """GEMM k's (x, dy) as its taps export them (dense.tap_structs)."""
        return tap_structs(*self.gemm_shapes[k], self.dtype, self.fp8)

    def weight_grads(self, w_grads: dict, wstash, branch, ctl, layer: int, part: int):
        """(the gradients to add now, the W stash): B stores each GEMM's (x, dy) of the layer;
        a whole backward turns them into weight gradients at once."""
        if part == S.BWD_INPUT:
            xdy = {k: map_entry(lambda a: vary(a, self.manual), w_grads[k][1:]) for k in self.dense}
            wstash = self.store.put(wstash, branch, ctl, layer, xdy)
            return {k: a for k, a in w_grads.items() if k not in self.dense}, wstash
        return {k: weight_grad(*a[1:], dtype=self.dtype) if k in self.dense else a
                for k, a in w_grads.items()}, wstash

    def wstash_entry(self) -> dict:
        """One layer's W stash entry, as ShapeDtypeStructs."""
        return {k: self.taps(k) for k in self.dense}


class HeadSums(NamedTuple):
    """What the head over the pipe updates: only these pass through its conditional."""
    loss: jax.Array         # () float32 loss sum
    vocab: dict             # float32 gradients of this stage's vocabulary slice
    bwd: jax.Array          # (B+1, b, s, h) the inbox's backward slots (dy -> loss slot)


@dataclass
class PipeHead:
    """The head over every stage (pipeline/head.py): each takes 1/p of the vocabulary."""
    cfg: Any
    sh: Any
    slices: VocabSlices
    weights: dict           # {'embed', 'head'}: this stage's vocabulary slice, compute dtype
    stage: jax.Array        # () this stage on 'pipe'
    loss_stage: int         # the last chunk's stage (p - 1; ZB-V: 0): where the loss counts


@dataclass
class StageOps:
    """The constants every tick of one step reads (none changes them) and the ops over them."""
    mc: Any                 # model config
    sh: Any                 # Sharder, inside the shard_map
    manual: tuple           # the shard_map's manual axes
    dtype: Any              # compute dtype
    tokens: jax.Array       # (m, b, s+1) this replica's microbatches
    keys: jax.Array | None  # (m, b) dropout keys per row, or None
    params: dict            # float32 stage params (the embedding gradient is taken on them)
    compute: dict           # compute-dtype params
    weights: list           # [v][Lmax] {name: weight or MasterGrad}: loop constants
    layer: Callable         # (weights, x, layer index, key rows) -> y
    stash: Store            # the residual stash's
    split: WholeBackward | SplitBackward
    send_field: Callable    # Branch -> 'send_down' | 'send_up'
    pipe_head: PipeHead | None      # None: the last chunk's forward branch runs the whole head
    res: Residuals = field(default_factory=Residuals)   # pullbacks <-> stashable leaves
    starts: jax.Array | None = None  # (m, b, s) each token's document start (document masking)
    host: HostStash | None = None    # train.recompute=offload: the leaves kept on the host

    def key_rows(self, mb):
        """What the layers take per row of microbatch mb (models/model.layer_rows)."""
        keys = None if self.keys is None else self.keys[mb]
        return keys if self.starts is None else Rows(keys, self.starts[mb])

    def layer_fwd(self, layer_w, x, idx, mb):
        """One layer's output and its residuals to stash."""
        layer_w = self.split.vjp_weights(layer_w)
        y, pull = jax.vjp(lambda w_, x_: self.layer(w_, x_, idx, self.key_rows(mb)), layer_w, x)
        return y, self.res.split(pull, layer_w)

    # ------------------------------------------------------------------ switch branches
    def branch(self, branch: Branch) -> Callable:
        if branch.op == S.IDLE:
            return idle
        if branch.op == S.FWD:
            return lambda state, ctl: self.forward(branch, state, ctl)
        if branch.op == S.BWD_WEIGHT:
            return lambda state, ctl: self.weight(branch, state, ctl)
        return lambda state, ctl: self.backward(branch, state, ctl)

    def forward(self, branch: Branch, state: PipeState, ctl: TickControl) -> PipeState:
        """A chunk's forward: input from the embedding or the inbox, each layer's residuals
        to the stash, the output to the send buffer or the head."""
        if branch.first:
            x = M.embed(self.mc, self.sh, self.compute["embed"], self.tokens[ctl.mb, :, :-1],
                        self.key_rows(ctl.mb))
        else:
            x = state.inbox.fwd[ctl.fwd_in_slot]
        stash, transit, weights = state.stash, state.transit, self.weights[branch.vchunk]
        for l in range(branch.n_layers):
            x, leaves = self.layer_fwd(weights[l], x, ctl.first_layer + l, ctl.mb)
            leaves = tuple(vary(a, self.manual) for a in leaves)
            if self.host is not None:
                leaves, moved = self.host.split(leaves)
                transit = self.host.write(transit, l, moved)
            stash = self.stash.put(stash, branch, ctl, l, leaves)
        state = state._replace(stash=stash, transit=transit)
        if branch.last:
            if self.pipe_head is not None:
                return state._replace(head_y=x.astype(self.dtype))
            return self.head(state, x, ctl)
        return self.send(state, branch, x)

    def backward(self, branch: Branch, state: PipeState, ctl: TickControl) -> PipeState:
        """A chunk's backward (or its upper or lower half, or B): the layers' pullbacks from
        the stash, weight gradients into the sums (or B's operands into the W stash), the input
        gradient to the send buffer, the lower half (mid) or the embedding's gradient."""
        part = branch.op
        grad = state.mid if part == S.BWD_LOWER else state.inbox.bwd[ctl.bwd_in_slot]
        sums, wstash = list(state.sums.layers[branch.vchunk]), state.wstash
        for l in reversed(_layer_range(part, branch.n_layers)):
            layer_w = self.split.vjp_weights(self.weights[branch.vchunk][l])
            leaves = self.stash.get(state.stash, branch, ctl, l)
            if self.host is not None:
                leaves = self.host.join(leaves, self.host.read(state.transit, ctl, l))
            pull = self.res.join(leaves, layer_w)
            w_grads, grad = pull(grad)
            w_grads, wstash = self.split.weight_grads(w_grads, wstash, branch, ctl, l, part)
            sums[l] = dict(sums[l], **f32_add({k: sums[l][k] for k in w_grads},
                                              grads_of(w_grads)))
        state = state._replace(sums=_with_chunk(state.sums, branch.vchunk, sums), wstash=wstash)
        if part == S.BWD_UPPER:
            return state._replace(mid=grad.astype(self.dtype))
        if branch.first:
            return state._replace(sums=state.sums._replace(
                embed=self.embed_grad(state.sums.embed, grad, ctl.mb)))
        return self.send(state, branch, grad)

    def weight(self, branch: Branch, state: PipeState, ctl: TickControl) -> PipeState:
        """W: the weight gradients of a chunk's GEMMs from the W stash, added to the float32
        sums inside the GEMMs."""
        sums = list(state.sums.layers[branch.vchunk])
        for l in range(branch.n_layers):
            xdy = self.split.store.get(state.wstash, branch, ctl, l)
            sums[l] = dict(sums[l], **{k: sums[l][k] + weight_grad(x, dy, self.dtype)
                                       for k, (x, dy) in xdy.items()})
        return state._replace(sums=_with_chunk(state.sums, branch.vchunk, sums))

    def send(self, state: PipeState, branch: Branch, x) -> PipeState:
        """x to this branch's send buffer (activations down, gradients up; routing.py)."""
        wire = state.wire._replace(**{self.send_field(branch): x.astype(self.dtype)})
        return state._replace(wire=wire)

    # ------------------------------------------------------------------ the head, the embedding
    def head(self, state: PipeState, y, ctl: TickControl) -> PipeState:
        """The last chunk's forward on its own stage: loss, its gradient (seeds this
        microbatch's backward, into the loss slot), head and (tied) embedding gradients."""
        targets = self.tokens[ctl.mb, :, 1:]
        loss, (g_e, g_h, dy) = jax.value_and_grad(
            lambda e, hd, y_: M.head_loss(self.mc, self.sh, e, hd, y_, targets),
            argnums=(0, 1, 2))(self.compute["embed"], self.compute["head"], y)
        sums = state.sums._replace(loss=state.sums.loss + loss,
                                   embed=f32_add(state.sums.embed, g_e),
                                   head=f32_add(state.sums.head, g_h))
        return state._replace(sums=sums, inbox=state.inbox._replace(
            bwd=state.inbox.bwd.at[ctl.loss_ct_slot].set(dy.astype(self.dtype))))

    def head_over_pipe(self, out: HeadSums, head_y, ctl: TickControl) -> HeadSums:
        """The head of this tick's last-chunk forward, every stage taking 1/p of the
        vocabulary; the loss counts on the last chunk's stage, dy lands in its loss slot."""
        h = self.pipe_head
        last = h.stage == h.loss_stage
        loss, grads, dy = head_over_pipe(h.cfg, h.sh, h.weights, h.slices, h.stage, head_y,
                                         last, self.tokens[ctl.head_mb, :, 1:])
        return HeadSums(out.loss + jnp.where(last, loss, 0.0), f32_add(out.vocab, grads),
                        out.bwd.at[ctl.loss_ct_slot].set(dy.astype(self.dtype)))

    def embed_grad(self, g_embed, dx, mb):
        """The input gradient of chunk 0 into the embedding, taken against the float32
        tables so that XLA scatter-adds it into the sum in place."""
        _, pull = jax.vjp(lambda e: M.embed(self.mc, self.sh, e, self.tokens[mb, :, :-1],
                                            self.key_rows(mb)), self.params["embed"])
        (grads,) = pull(dx.astype(jnp.float32))
        return jax.tree.map(jnp.add, g_embed, grads)


def idle(state: PipeState, ctl: TickControl) -> PipeState:
    return state


def _layer_range(part: int, n: int) -> range:
    """The layers of a chunk that a backward op runs: the upper half, the lower, or all."""
    lo, hi = {S.BWD_UPPER: (n // 2, n), S.BWD_LOWER: (0, n // 2), S.BWD_FULL: (0, n),
              S.BWD_INPUT: (0, n)}[part]
    return range(lo, hi)


def _with_chunk(sums, vchunk: int, grads: list):
    """sums with chunk vchunk's layer gradients replaced."""
    layers = list(sums.layers)
    layers[vchunk] = tuple(grads)
    return sums._replace(layers=tuple(layers))
