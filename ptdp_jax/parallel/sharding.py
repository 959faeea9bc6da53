"""The one logical-axis rule table, and the helpers that apply it.

Model code names logical axes only ('batch', 'heads', 'vocab', ...). This table
maps them onto the mesh axes ('data', 'pipe', 'tensor'); Megatron's split
follows from it: QKV and the first MLP projection are column-parallel
('heads'/'mlp' on 'tensor' in their output dims), the attention output and the
second MLP projection row-parallel (same axes in their input dims), embedding
and logits vocab-parallel ('vocab' on 'tensor').

Sequence parallelism (Korthikanti et al. 2022, Megatron's --sequence-parallel) is one more
row: 'act_seq', the sequence dim of the (b, s, h) activations outside the tensor-parallel
GEMMs (residual stream, LayerNorm/RMSNorm, dropout, stage-to-stage messages), maps to None,
or to 'tensor' in a Sharder made with sequence_parallel=True (SEQUENCE_PARALLEL_RULES over
the table). 'seq' (the sequence inside attention and the MLP, where heads or ffn are split)
never does. Each row-parallel GEMM's all-reduce then becomes a reduce-scatter (partial sums
-> 'act_seq' on 'tensor') and each column-parallel GEMM's input an all-gather
(`models/layers.gather_seq`); in the backward the two swap.

Which token dim is split: NCCL gathers and scatters along the major dim, so a split of the
sequence (dim 1 of (b, s, h)) costs XLA a transpose around every all-gather and
reduce-scatter when b > 1 (1.3B (1,1,2) micro 4: ~27 ms a GPU of transposes, one per
collective, 2x H100, 2026-11-27). The norms, dropout and the residual stream work token by token, so where t
divides the microbatch's rows the split goes to the rows instead ('act_batch' on
('data', 'tensor'): SEQUENCE_PARALLEL_ROWS_RULES, `sequence_parallel_rows`): the same memory,
the same collectives, no transposes. Otherwise (micro 1 in a pipeline: b = 1, nothing to
transpose) the sequence.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from ptdp_jax.config import decisions as D
from ptdp_jax.parallel.manual import vary, varying_axes  # noqa: F401  (re-exported)
MESH_AXES = ("data", "pipe", "context", "tensor")

LOGICAL_RULES: dict[str, str | None] = {
    "batch": "data",       # microbatch rows
    "stage": "pipe",       # leading axis of the stacked layers: one slice per pipeline stage
    "vocab": "tensor",     # vocab-parallel embedding, logits and cross-entropy
    "heads": "tensor",     # attention heads (QKV column-parallel, output row-parallel)
    "mlp": "tensor",       # MLP hidden (first GEMM column-, second row-parallel)
    "chunk": None,         # virtual stage (model chunk) index on a stage
    "layers": None,        # layers inside a chunk
    "embed": None,         # hidden size h
    "embed_sg": "tensor",  # h of a stage-to-stage message under scatter/gather
    "seq": None,           # sequence inside attention / MLP (each rank needs all of it)
    "act_batch": "data",   # rows of (b, s, h) activations: also 'tensor' under sequence
                           # parallelism where t divides them (SEQUENCE_PARALLEL_ROWS_RULES)
    "act_seq": None,       # sequence of (b, s, h) activations: 'tensor' under sequence parallelism
    "head_dim": None,
    # The train state only: with parallel.zero >= 1 (ZeRO, Megatron's distributed optimizer)
    # one dim of each parameter, and of its AdamW moments, is split over the replicas of the
    # weights, data x context (zero_axes).
    "zero": ("data", "context"),
}
ZERO_AXES = ("data", "context")     # the mesh axes the weights are replicated over

STACK_AXES = ("stage", "chunk", "layers")   # the layer stack's leading axes: never ZeRO-split

# Overrides under sequence parallelism: the activations are split by sequence, so the
# stage-to-stage message is already split over 'tensor' and scatter/gather ('embed_sg') has
# nothing left to split (Megatron retired --scatter-gather-tensors-in-pipeline for this).
SEQUENCE_PARALLEL_RULES: dict[str, str | None] = {"act_seq": "tensor", "embed_sg": None}
# ... split by rows instead, where t divides the microbatch (no transposes around NCCL).
SEQUENCE_PARALLEL_ROWS_RULES: dict = {"act_batch": ("data", "tensor"), "embed_sg": None}


def sequence_parallel_on(parallel) -> bool:
    """Whether a `ParallelConfig` runs sequence parallelism: parallel.sequence_parallel with
    parallel.tensor > 1 (with t = 1 there is nothing to split over: a no-op, as in Megatron)."""
    return bool(getattr(parallel, "sequence_parallel", False)) and parallel.tensor > 1


def sequence_parallel_rows(cfg) -> bool:
    """Whether sequence parallelism splits the activations' rows (t divides
    train.micro_batch_size, the rows of a microbatch on one data replica) rather than their
    sequence: the same split of the tokens, along the major dim."""
    return sequence_parallel_on(cfg.parallel) and cfg.train.micro_batch_size % cfg.parallel.tensor == 0


def rules(sequence_parallel: bool = False, rows: bool = False) -> dict:
    """The rule table: LOGICAL_RULES, with SEQUENCE_PARALLEL_RULES (or _ROWS_RULES) under
    sequence parallelism."""
    if not sequence_parallel:
        return LOGICAL_RULES
    return {**LOGICAL_RULES, **(SEQUENCE_PARALLEL_ROWS_RULES if rows else SEQUENCE_PARALLEL_RULES)}


def make_mesh(shape: tuple[int, ...], devices=None, *,
              allow_cross_host_tensor: bool = False) -> Mesh:
    """A ('data', 'pipe', 'context', 'tensor') mesh over the first d*p*c*t devices; `shape` is
    (d, p, t) (context 1) or (d, p, c, t) (`ParallelConfig.mesh_dims`).

    Tensor is the fastest-varying axis, so tensor-parallel groups are neighbouring devices,
    and context the next, so that a sequence's devices stay next to each other (inside a host).
    With several processes (hosts) the mesh covers all devices and keeps 'tensor' inside a host
    (ptdp_jax.parallel.distributed.host_mesh_devices)."""
    d, p, c, t = shape if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])
    if devices is None and jax.process_count() > 1:
        from ptdp_jax.parallel.distributed import host_mesh_devices
        arr = host_mesh_devices((d, p * c, t), allow_cross_host_tensor).reshape(d, p, c, t)
        return Mesh(arr, MESH_AXES, axis_types=(AxisType.Auto,) * 4)
    devs = list(devices if devices is not None else jax.devices())[: d * p * c * t]
    arr = np.asarray(devs, dtype=object).reshape(d, p, c, t)
    return Mesh(arr, MESH_AXES, axis_types=(AxisType.Auto,) * 4)


def logical_to_spec(names: tuple[str | None, ...], manual: frozenset[str] = frozenset(),
                    sequence_parallel: bool = False, rows: bool = False) -> P:
    """Logical axis names -> PartitionSpec, leaving out axes that are manual here."""
    table = rules(sequence_parallel, rows)
    out = []
    for name in names:
        axis = table[name] if name is not None else None
        if isinstance(axis, tuple):
            axis = tuple(a for a in axis if a not in manual)
            axis = axis[0] if len(axis) == 1 else (axis or None)
        out.append(None if axis in manual else axis)
    return P(*out)


def zero_ways(par) -> int:
    """How many replicas of the weights ZeRO splits the state over: data x context."""
    return par.data * par.context


def zero_axes(names: tuple[str, ...], shape: tuple[int, ...], d: int,
              tensor: int = 1) -> tuple[str, ...]:
    """A parameter's logical axes in the ZeRO-sharded train state (parallel.zero >= 1 on d
    replicas of the weights, `zero_ways`): its first (major-most) dim that no rule splits
    (logical axis mapped to None, or to 'tensor' when tensor == 1; not a layer-stack axis) and
    that d divides is renamed 'zero', so `logical_to_spec` splits it over ZERO_AXES. The major-most dim: NCCL
    gathers and scatters along a tensor's major dim, and a split minor dim cost a transpose of
    every gradient shard after the backward (7.5B zero=2: 18 ms a step for fc2_w split on h,
    4x H200, 2026-11-27). `shape` is the per-layer shape (names may lead with STACK_AXES,
    which are skipped). No such dim (e.g. a
    bias over the tensor-split heads, or h not divisible by d): the names come back unchanged
    and the tensor stays replicated over them."""
    lead = len(names) - len(shape)
    best = None
    for i, (name, size) in enumerate(zip(names[lead:], shape)):
        rule = LOGICAL_RULES.get(name)
        unsplit = rule is None or (rule == "tensor" and tensor == 1)
        if name in STACK_AXES or size % d or not unsplit:
            continue
        best = i
        break
    if best is None or d == 1:
        return tuple(names)
    out = list(names)
    out[lead + best] = "zero"
    return tuple(out)


def data_axis(spec: P) -> int | None:
    """The dim a PartitionSpec splits over 'data' (the ZeRO dim of a state tensor), or None."""
    for i, entry in enumerate(spec):
        if entry == "data" or (isinstance(entry, tuple) and "data" in entry):
            return i
    return None


def tp_overlap_on(cfg, mesh) -> bool:
    """The tensor ring on the devices of `mesh` (decisions.tp_comm_overlap_devices); the mesh
    is looked at only where the config asks for the ring."""
    return D.tp_comm_overlap(cfg) and D.tp_comm_overlap_devices(
        cfg, _gpu_groups_in_one_process(mesh, 2))


def _gpu_groups_in_one_process(mesh, axis: int) -> bool:
    """Whether `mesh` is of GPUs and each group along mesh axis `axis` (2: the tensor groups,
    0: the data groups) lives in one process, where XLA's peer mode copies between them."""
    if mesh is None:
        return False
    devs = np.moveaxis(mesh.devices, axis, -1)
    groups = devs.reshape(-1, devs.shape[-1])
    return (groups.flat[0].platform == "gpu"
            and all(len({d.process_index for d in group}) == 1 for group in groups))


@dataclass(frozen=True)
class Sharder:
    """Applies the rule table. Outside shard_map it needs the mesh; inside a
    shard_map that is manual over some axes, specs drop those axes. sequence_parallel:
    the table with SEQUENCE_PARALLEL_RULES (`sequence_parallel_on(cfg.parallel)`); rows:
    with SEQUENCE_PARALLEL_ROWS_RULES instead (`sequence_parallel_rows(cfg)`); tp_overlap: the
    tensor-parallel GEMMs through models/tp_overlap.py; `for_config` makes all three from a
    config. in_layer_scan: set by the layer scan (models.model.run_layers) for what runs inside it."""
    mesh: Mesh | None = None
    manual: frozenset[str] = frozenset()
    sequence_parallel: bool = False
    in_layer_scan: bool = False
    rows: bool = False
    tp_overlap: bool = False    # the tensor ring (models/tp_overlap.py, tp_overlap_on)
    fp8: bool = False           # train.fp8: the layers' GEMMs on FP8 operands (models/fp8.py)
    fp8_steady: bool = False    # delayed scaling whose history rows all hold an exponent
    attention: str = "auto"     # tuning.attention (decisions.attention)
    context: int = 1            # parallel.context: a device's rows are chunks of sequences
                                # (parallel/context.py), inside a region manual over 'context'

    @classmethod
    def for_config(cls, cfg, mesh) -> "Sharder":
        sp = sequence_parallel_on(cfg.parallel)
        return cls(mesh, sequence_parallel=sp, rows=sequence_parallel_rows(cfg),
                   tp_overlap=sp and tp_overlap_on(cfg, mesh), fp8=cfg.train.fp8,
                   attention=cfg.tuning.attention, context=cfg.parallel.context)

    def positions(self, rows: int, s: int):
        """(rows, s) int32: where each token of a device's rows sits in its sequence."""
        if self.context == 1:
            return jnp.broadcast_to(jnp.arange(s, dtype=jnp.int32), (rows, s))
        from ptdp_jax.parallel import context as C
        return C.positions(self.context, jax.lax.axis_index(C.AXIS), s, rows)

    def document_starts(self, tokens_bs, eos: int):
        """(rows, s) int32: where each token of a device's rows begins its document (after the
        last `eos` before it in its sequence; parallel/context.py)."""
        from ptdp_jax.parallel import context as C
        return C.document_starts(tokens_bs, eos, self.context)

    def spec(self, names) -> P:
        return logical_to_spec(tuple(names), self.manual, self.sequence_parallel, self.rows)

    def constrain(self, x, names):
        if self.mesh is None and not self.manual:
            return x                     # single device, no mesh: nothing to say
        if self.mesh is not None and self.manual >= frozenset(self.mesh.axis_names):
            return x                     # fully manual: every array is a per-device block
        spec = self.spec(names)
        if self.manual:
            return jax.lax.with_sharding_constraint(x, spec)
        return jax.lax.with_sharding_constraint(x, NamedSharding(self.mesh, spec))

    def inside(self, axes) -> "Sharder":
        return replace(self, manual=self.manual | frozenset(axes))

    def rest_axes(self) -> tuple[str, ...]:
        """The mesh axes not manual yet (what a per_device region is manual over)."""
        return tuple(a for a in self.mesh.axis_names if a not in self.manual)

    def per_device(self, fn, in_names, out_names):
        """fn on each device's block: a shard_map, nested in the current one, that is
        manual over every mesh axis not manual yet (size-1 axes too, so nothing is left
        to GSPMD's partitioner inside). Inputs and outputs are laid out by the rule table
        (logical names), or by a PartitionSpec given as is; nested tuples for pytrees."""
        rest = self.rest_axes()
        if not rest:
            return fn

        def specs(names):
            if isinstance(names, P):
                return names
            if names and isinstance(names[0], str):
                return self.spec(names)
            return tuple(specs(n) for n in names)
        mesh = jax.sharding.get_abstract_mesh()      # the enclosing region's; none on (1, 1, t)
        return jax.shard_map(fn, mesh=self.mesh if mesh.empty else mesh, in_specs=specs(in_names),
                             out_specs=specs(out_names), axis_names=set(rest))


def manual_axes(mesh) -> tuple[str, ...]:
    """The mesh axes the train and eval steps' shard_map is manual over.

    'data' and 'pipe' ('tensor' stays automatic: GSPMD does tensor parallelism from the
    annotations); size-1 axes are manual too, so that attention's nested per-device region
    (layers.causal_attention) only has 'tensor' left, and no reduction runs over a size-1
    axis. Without tensor parallelism every axis is manual, so nothing inside is left to
    GSPMD's partitioner (cuDNN attention's custom partitioner fails inside a partially
    manual region). One device, or (1, 1, t): nothing manual, all GSPMD."""
    if mesh.size == 1 or mesh.size == mesh.shape["tensor"]:
        return ()
    if mesh.shape["tensor"] == 1:
        return ("data", "pipe", "context", "tensor")
    return ("data", "pipe", "context")


def manual_spec(spec: P, manual) -> P:
    """The part of a PartitionSpec over the manual axes (a shard_map's in/out spec)."""
    def keep(entry):
        if isinstance(entry, tuple):
            kept = tuple(a for a in entry if a in manual)
            return kept[0] if len(kept) == 1 else (kept or None)
        return entry if entry in manual else None
    return P(*[keep(e) for e in spec])


def psum_over(x, manual, spec):
    """Sum x over the manual axes its PartitionSpec does not shard it over."""
    sharded = {a for entry in spec if entry for a in ((entry,) if isinstance(entry, str) else entry)}
    axes = tuple(a for a in manual if a not in sharded)
    return jax.lax.psum(x, axes) if axes else x


def shift_pairs(n: int, k: int) -> list[tuple[int, int]]:
    """ppermute's pairs: rank r sends to rank r + k (mod n)."""
    return [(r, (r + k) % n) for r in range(n)]


def rank_plus(axis: str, k: int):
    """(r + k) mod n for this rank r of manual mesh axis `axis` (n ranks), traced, written one
    way for every k of one residue mod n: a ring's block index computed as (r - i) % n in one
    place and (r + i + 1) % n in another gives XLA two index programs for one block, and every
    slice taken with them is made (and its fused producer run) once per program."""
    n, r = jax.lax.axis_size(axis), jax.lax.axis_index(axis)
    k %= n
    return r if k == 0 else jax.lax.rem(r + k, n)


def direct_gather(block, axis: str) -> list:
    """[(j, rank j's block)] for the n ranks of manual mesh axis `axis`, this rank's first:
    the block is sent straight to every other rank at once (n - 1 permutes of shift k, none
    reading another's output); j is traced (rank r receives rank r - k's block)."""
    n = jax.lax.axis_size(axis)
    return [(rank_plus(axis, -k),
             block if k == 0 else jax.lax.ppermute(block, axis, shift_pairs(n, k)))
            for k in range(n)]


def direct_scatter(part_of, axis: str):
    """This rank's block of the sum over the ranks of `axis` of part_of(j), each rank's
    contribution to block j: the contribution to block r + k is sent straight to rank r + k
    (k = 1 .. n - 1, each as soon as it is computed), then the rank adds its own part and the
    n - 1 received ones, in the order k = 1 .. n - 1."""
    n = jax.lax.axis_size(axis)
    sent = [jax.lax.ppermute(part_of(rank_plus(axis, k)), axis, shift_pairs(n, k))
            for k in range(1, n)]
    acc = part_of(rank_plus(axis, 0))
    for part in sent:
        acc = acc + part
    return acc
