"""The train state, in one place: what it holds, how it is made, initialised, sharded,
and turned into the canonical (mesh- and schedule-independent) layout and back.

    tx, lr = make_optimizer(cfg)                  # AdamW with the learning-rate schedule
    state = init_state(cfg, tx)                   # a TrainState: params, opt, step, bad_steps
    state = state.apply_gradients(tx, grads, finite)   # one update (step.py)
    shardings = state_shardings(cfg, mesh, tx)    # NamedShardings of that state on the mesh
    canonical = to_canonical_state(cfg, tx, state)   # layers (L, ...): checkpoints, export
    state = to_stage_state(cfg, tx, canonical)

Two layouts of the layer stack (ptdp_jax.models.model): *stage* (p, v, Lmax, ...), the
one training runs on (chunk c of `chunk_layers(cfg)` on stage c % p, or for ZB-V on
stage c or 2p-1-c (`chunk_placement`), padded to the largest chunk), and *canonical* (L, ...), the one checkpoints, exports and
`TrainResult.params` use. The optimizer moments mirror the parameters in either layout.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Any

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding, PartitionSpec as P

from ptdp_jax.models import model as M
from ptdp_jax.pipeline.balance import chunk_layers, chunk_placement
from ptdp_jax.parallel.sharding import STACK_AXES, logical_to_spec, zero_axes, zero_ways
from ptdp_jax.training import fp8_state as FS


# ----------------------------------------------------------------------------- the state

@dataclass(frozen=True, eq=False)
class TrainState:
    """Everything a step reads and writes, one pytree (also of shardings or ShapeDtypeStructs).
    A checkpoint stores `as_dict()`, the tree of these four names (checkpoint.py); per-run
    state added later (FP8 scaling history, say) is one more field here. Read access by name
    (`state["params"]`, `dict(state, step=s)`) serves code that reads the state as a mapping."""
    params: Any             # {'embed', 'layers', 'head'} float32 master weights (stage or
                            #   canonical layout)
    opt: Any                # `make_optimizer`'s optax state: AdamW moments mirror params
    step: Any               # () int32 updates run (non-finite ones skipped but counted)
    bad_steps: Any          # () int32 non-finite steps in a row
    fp8: Any = None         # delayed FP8 scaling's amax history (training/fp8_state.py), or None

    def apply_gradients(self, tx, grads, finite, fp8_seen=None) -> "TrainState":
        """One optimizer update from float32 mean gradients (and the FP8 history's from what the
        GEMMs saw). A non-finite step (finite False) leaves parameters, optimizer state and
        history unchanged and counts in bad_steps."""
        updates, new_opt = tx.update(grads, self.opt, self.params)
        new_params = optax.apply_updates(self.params, updates)
        keep = partial(jax.tree.map, lambda new, old: jnp.where(finite, new, old))
        fp8 = None if self.fp8 is None else FS.update(self.fp8, fp8_seen, finite)
        return TrainState(params=keep(new_params, self.params), opt=keep(new_opt, self.opt),
                          step=self.step + 1,
                          bad_steps=jnp.where(finite, 0, self.bad_steps + 1), fp8=fp8)

    def replace(self, **changes) -> "TrainState":
        return dataclasses.replace(self, **changes)

    def as_dict(self) -> dict:
        """The tree a checkpoint stores (with 'fp8' only where there is a history)."""
        return {k: getattr(self, k) for k in self.keys()}

    @classmethod
    def of(cls, tree) -> "TrainState":
        """A TrainState from itself or from a mapping of its names (a restored tree)."""
        if isinstance(tree, cls):
            return tree
        return cls(**{k: tree[k] for k in FIELDS}, fp8=tree.get("fp8"))

    def keys(self):
        return FIELDS if self.fp8 is None else FIELDS + ("fp8",)

    def __getitem__(self, name: str):
        if name not in self.keys():
            raise KeyError(name)
        return getattr(self, name)

    def __iter__(self):
        return iter(self.keys())

    def __len__(self) -> int:
        return len(self.keys())


FIELDS = ("params", "opt", "step", "bad_steps")
_LEAF_ORDER = tuple(sorted(FIELDS + ("fp8",)))   # as a dict of these names flattens (None: no
                                        # leaves): the same leaves in the same order, so the
                                        # compiled step's arguments too
jax.tree_util.register_pytree_with_keys(
    TrainState,
    lambda s: (tuple((jax.tree_util.GetAttrKey(k), getattr(s, k)) for k in _LEAF_ORDER), None),
    lambda _, leaves: TrainState(**dict(zip(_LEAF_ORDER, leaves))),
    lambda s: (tuple(getattr(s, k) for k in _LEAF_ORDER), None))


# ----------------------------------------------------------------------------- make

def lr_schedule(cfg):
    """Learning rate of the update of step k (0-based): a linear warm-up from 0 over
    train.warmup_steps (its length whatever the run's: a short run of a long warm-up stays
    at a small lr), then train.lr_schedule down to lr * min_lr_ratio at step D =
    train.decay_steps (default train.steps), constant after:

        cosine     a half cosine from lr over the steps warmup_steps..D
        linear     a straight line over the same steps
        constant   lr (min_lr_ratio unused)
        wsd        lr, then a straight line over the last train.decay_fraction of D

    A warm-up of D steps or more leaves the decay one step. The schedule is evaluated at
    k + 1, so the first update does not run at lr = 0 and the last step of the decay
    reaches the minimum; it depends on the step alone (the optimizer state's count, which
    checkpoints keep), not on train.steps once decay_steps is set, so a run can be stopped
    early, resumed or extended without changing it."""
    t = cfg.train
    end, warm = t.decay_steps or t.steps, t.warmup_steps
    peak, low = t.lr, t.lr * t.min_lr_ratio
    if t.lr_schedule == "cosine":
        base = optax.warmup_cosine_decay_schedule(
            0.0, peak, warmup_steps=warm, decay_steps=max(end, warm + 1), end_value=low)
    else:
        ramp = optax.linear_schedule(0.0, peak, warm)
        if t.lr_schedule == "constant":
            parts, bounds = [ramp, optax.constant_schedule(peak)], [warm]
        elif t.lr_schedule == "linear":
            parts, bounds = [ramp, optax.linear_schedule(peak, low, max(end - warm, 1))], [warm]
        elif t.lr_schedule == "wsd":
            start = max(end - wsd_decay_steps(cfg), warm)
            parts = [ramp, optax.constant_schedule(peak),
                     optax.linear_schedule(peak, low, max(end - start, 1))]
            bounds = [warm, start]
        else:
            raise ValueError(f"train.lr_schedule={t.lr_schedule!r}")
        base = optax.join_schedules(parts, bounds)
    return lambda count: base(count + 1)


def wsd_decay_steps(cfg) -> int:
    """The steps of wsd's decay: train.decay_fraction of the schedule's length, at least 1."""
    t = cfg.train
    return max(1, round(t.decay_fraction * (t.decay_steps or t.steps)))


def make_optimizer(cfg):
    """(AdamW transformation, its learning-rate schedule)."""
    t = cfg.train
    schedule = lr_schedule(cfg)
    shapes = M.param_shapes(cfg.model)
    # Weight decay on matrices only: no decay on biases and norm scales (1-D per layer).
    decay_mask = {g: {k: len(s) - (1 if g == "layers" else 0) >= 2 for k, s in grp.items()}
                  for g, grp in shapes.items()}
    tx = optax.chain(
        optax.clip_by_global_norm(t.grad_clip) if t.grad_clip > 0 else optax.identity(),
        optax.adamw(schedule, b1=t.adam_betas[0], b2=t.adam_betas[1], weight_decay=t.weight_decay,
                    mask=decay_mask),
    )
    return tx, schedule


def _fresh(params, tx, fp8=None) -> TrainState:
    return TrainState(params=params, opt=tx.init(params), step=jnp.zeros((), jnp.int32),
                      bad_steps=jnp.zeros((), jnp.int32), fp8=fp8)


def fresh_fp8(cfg, stage_layout: bool = True):
    """A fresh run's FP8 amax history (training/fp8_state.py), or None without one."""
    if not FS.delayed(cfg):
        return None
    history = FS.init_history(cfg)
    return stage_layers(cfg, history) if stage_layout else history


# ----------------------------------------------------------------------------- init

def init_state(cfg, tx):
    """A fresh train state in stage layout (parameters from train.seed)."""
    return _fresh(stage_params(cfg, M.init_params(cfg.model, cfg.train.seed)), tx,
                  fresh_fp8(cfg))


def state_from_params(cfg, tx, canonical):
    """A fresh train state (step 0, new optimizer moments) around canonical parameters."""
    return _fresh(stage_params(cfg, canonical), tx, fresh_fp8(cfg))


def canonical_abstract_state(cfg, tx):
    """ShapeDtypeStructs of the canonical train state (no shardings)."""
    return jax.eval_shape(lambda: _fresh(M.init_params(cfg.model, cfg.train.seed), tx,
                                         fresh_fp8(cfg, stage_layout=False)))


def abstract_state(cfg, tx, shardings=None):
    """ShapeDtypeStructs of the stage-layout train state (with shardings, if given)."""
    out = jax.eval_shape(lambda: init_state(cfg, tx))
    return out if shardings is None else with_shardings(out, shardings)


# ----------------------------------------------------------------------------- shard

def stage_param_specs(cfg):
    """PartitionSpecs (over the whole mesh) of the parameters in stage layout, as the model
    uses them (the compute layout: no ZeRO split)."""
    axes = M.param_logical_axes(cfg.model, stage_layout=True)
    return jax.tree.map(lambda n: logical_to_spec(n), axes, is_leaf=lambda x: isinstance(x, tuple))


def zero_stage(cfg) -> int:
    """parallel.zero where it does something (data x context > 1), else 0."""
    return cfg.parallel.zero if zero_ways(cfg.parallel) > 1 else 0


def state_param_axes(cfg, stage_layout: bool = False):
    """Logical axes of the parameters as the train state holds them: the model's, and with
    parallel.zero >= 1 one dim of each renamed 'zero' (-> 'data', `sharding.zero_axes`).
    The AdamW moments mirror them, so master weights and moments are split alike."""
    axes = M.param_logical_axes(cfg.model, stage_layout)
    if not zero_stage(cfg):
        return axes
    layer = M.arch(cfg.model).param_specs(cfg.model)
    shapes = {"embed": layer["embed"], "layers": layer["layer"], "head": layer["head"]}
    ways, t = zero_ways(cfg.parallel), cfg.parallel.tensor
    return {g: {k: zero_axes(names, shapes[g][k][0], ways, t) for k, names in grp.items()}
            for g, grp in axes.items()}


def stage_state_specs(cfg):
    """PartitionSpecs of the parameters in stage layout as the train state holds them."""
    return jax.tree.map(lambda n: logical_to_spec(n), state_param_axes(cfg, stage_layout=True),
                        is_leaf=lambda x: isinstance(x, tuple))


def _state_shardings(cfg, mesh, tx, param_sh, abstract, fp8_spec=P()):
    rep = NamedSharding(mesh, P())
    opt_sh = optax.tree_map_params(tx, lambda _, s: s, abstract.opt, param_sh,
                                   transform_non_params=lambda _: rep)
    fp8_sh = (None if abstract.fp8 is None
              else {k: NamedSharding(mesh, fp8_spec) for k in abstract.fp8})
    return TrainState(params=param_sh, opt=opt_sh, step=rep, bad_steps=rep, fp8=fp8_sh)


def fp8_stage_spec():
    """The PartitionSpec of the FP8 history (and rows) in stage layout: the layer stack's."""
    return logical_to_spec(STACK_AXES + FS.TAIL_AXES)


def state_shardings(cfg, mesh, tx):
    """NamedShardings of the stage-layout train state (optimizer state mirrors params;
    with parallel.zero >= 1 both split over 'data' as well)."""
    param_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), stage_state_specs(cfg))
    return _state_shardings(cfg, mesh, tx, param_sh, jax.eval_shape(lambda: init_state(cfg, tx)),
                            fp8_stage_spec())


def canonical_shardings(cfg, mesh, tx):
    """Shardings of the canonical state on `mesh`: like the stage layout's, with the
    layer axis split over 'pipe' (so with v = 1 each stage keeps its own layers)."""
    axes = state_param_axes(cfg)
    spec = {g: {k: logical_to_spec(n) for k, n in grp.items()} for g, grp in axes.items()}
    spec["layers"] = {k: P("pipe", *logical_to_spec(n[1:])) for k, n in axes["layers"].items()}
    param_sh = jax.tree.map(lambda s: NamedSharding(mesh, s), spec,
                            is_leaf=lambda x: isinstance(x, P))
    return _state_shardings(cfg, mesh, tx, param_sh, canonical_abstract_state(cfg, tx))


def with_shardings(abstract, shardings):
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        abstract, shardings)


# ----------------------------------------------------------------------------- layouts

def stage_params(cfg, params):
    """Canonical parameters (layers (L, ...)) -> stage layout (p, v, Lmax, ...)."""
    return dict(params, layers=stage_layers(cfg, params["layers"]))


def stage_layers(cfg, layers):
    """A canonical layer stack {name: (L, ...)} -> stage layout (p, v, Lmax, ...)."""
    return M.to_stage_layout(layers, chunk_layers(cfg), cfg.parallel.pipe, chunk_placement(cfg))


def canonical_params(cfg, params):
    """Stage-layout parameters -> canonical (layers (L, ...))."""
    return dict(params, layers=M.to_canonical_layout(params["layers"], chunk_layers(cfg),
                                                     cfg.parallel.pipe, chunk_placement(cfg)))


def _layer_marks(cfg):
    """Params-shaped tree: True on stacked-layer leaves."""
    shapes = M.param_shapes(cfg.model)
    return {g: {k: g == "layers" for k in grp} for g, grp in shapes.items()}


def _map_layers(cfg, tx, state, fn):
    """Apply fn to every stacked-layer array of the params and of the optimizer moments."""
    state, marks = TrainState.of(state), _layer_marks(cfg)
    params = {g: {k: fn(x) if marks[g][k] else x for k, x in grp.items()}
              for g, grp in state.params.items()}
    opt = optax.tree_map_params(tx, lambda x, is_layer: fn(x) if is_layer else x,
                                state.opt, marks, transform_non_params=lambda x: x)
    fp8 = None if state.fp8 is None else {k: fn(x) for k, x in state.fp8.items()}
    return state.replace(params=params, opt=opt, fp8=fp8)


def to_canonical_state(cfg, tx, state):
    """Train state in stage layout (p, v, Lmax, ...) -> canonical (L, ...)."""
    counts, p, where = chunk_layers(cfg), cfg.parallel.pipe, chunk_placement(cfg)
    return _map_layers(cfg, tx, state,
                       lambda x: M.to_canonical_layout({"x": x}, counts, p, where)["x"])


def layer_marks(cfg, tx, state):
    """A tree of the state's structure: True on the stacked-layer arrays (params, their optimizer
    moments and the FP8 history: what the stage and canonical layouts lay out differently)."""
    return _map_layers(cfg, tx, jax.tree.map(lambda _: False, state), lambda _: True)


def canonical_layer_fn(cfg, sharding):
    """One stacked-layer array, stage layout -> canonical, jitted onto `sharding` (the canonical
    state's sharding of that array)."""
    counts, p, where = tuple(chunk_layers(cfg)), cfg.parallel.pipe, tuple(chunk_placement(cfg))
    return _canonical_layer_fn(counts, p, where, sharding)


@lru_cache(maxsize=256)
def _canonical_layer_fn(counts, p, where, sharding):
    return jax.jit(lambda x: M.to_canonical_layout({"x": x}, counts, p, where)["x"],
                   out_shardings=sharding)


def to_stage_state(cfg, tx, state):
    """Inverse of to_canonical_state."""
    counts, p, where = chunk_layers(cfg), cfg.parallel.pipe, chunk_placement(cfg)
    return _map_layers(cfg, tx, state,
                       lambda x: M.to_stage_layout({"x": x}, counts, p, where)["x"])
