"""Memory per device of a training layout, estimated before anything compiles.

    est = estimate_memory(cfg)          # bytes on the most loaded device of cfg's layout
    est.total, est.describe()           # "params 2.41 + grads 1.53 + ... = 9.55 GiB"
    device_memory_bytes()               # what the device has (None if unknown)

The model (bytes per device; the most loaded device of the layout):

* params, grads, optimizer: the float32 master weights, the weights in the compute dtype,
  the float32 gradient accumulators and AdamW's m and v, by parallel.zero
  (`ptdp_jax/training/state_memory.py`).
  The parameters held by a device: the layers of its pipeline stage in the padded stage layout
  (p, v, max layers per chunk, ...) of `ptdp_jax.pipeline.balance.chunk_layers`, plus the
  embedding and head, which every pipeline stage holds today; each tensor divided by t along
  the dimensions that `sharding.LOGICAL_RULES` maps to 'tensor' (heads, mlp, vocab).
* activations: the residuals one layer keeps for its backward, per token of a microbatch, by
  train.recompute and sequence parallelism (`ptdp_jax/training/activation_memory.py`),
  times the layers of the largest model chunk times the stash slots of the schedule
  (`Schedule.num_stash_slots`, + the executor's trash slot unless tuning.static_stash;
  one microbatch without pipelining),
  plus, for zero-bubble tables, the W stash (each GEMM's input and output gradient kept from
  B to W, `wstash_bytes`),
  plus the executor's stage-to-stage message buffers (split by sequence too under sequence
  parallelism), plus the float32 logits of one microbatch on the last stage, b s V / t x 4
  bytes (V / (t p) when the head is spread over the pipeline stages, `pipeline/head.py`;
  otherwise the fused head loss holds one chunk of them, `models/fused_loss.py`);
* workspace: 0.5 GiB for XLA's temporaries and the allocator (fitted), plus the recomputation
  transient of `full` (of selective's SwiGLU where it is not kept:
  `activation_recompute_bytes`), context parallelism's gathered keys and values
  (`context_attention_bytes`) and packed document attention's gradients
  (`document_attention_bytes`).

How close it gets, against the step's measured `peak_bytes_in_use` (GPT 1.3B and 7.5B, bf16,
s 2048, on H100 and H200, 2026-11-26; the rows are in tests/test_memory_estimate.py): within 4%
where the chunks are even; over by up to 9% for uneven chunks (the stash is allocated for the
largest chunk). Not modelled: zero=3 with unrolled layers, and zero=2 without recomputation,
keep more than estimated (XLA gathers several layers' weights early; under by 8-22%, 7.5B
(4,1,1) on 4x H200, 2026-11-27), and some layouts without recomputation are overestimated by
up to 19% (1.3B (4,1,1) and (1,1,4) on 4x H200, 2026-11-26).
No jax at module level: the model's parameter shapes and the chunk layout are imported when
an estimate is made.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ptdp_jax.training.activation_memory import (  # noqa: F401  (used here; two in __all__)
    TRANSIT_CHUNKS, activation_recompute_bytes, context_attention_bytes, device_tokens,
    document_attention_bytes, flash_attention_bytes_per_token, layer_activation_bytes_per_token,
    offloaded_bytes, sequence_parallel)

GiB = 1024 ** 3

LOGITS_BYTES = 4                    # float32 logits of one microbatch
SCAN_RESIDUAL_COPIES = 2            # zero=3's layer scan (p = 1): the residuals twice, fitted
                                    # to the 7.5B (4,1,1) zero=3 selective (46.17 GiB on 4x H200,
                                    # 2026-11-26); applied to that layout only
WORKSPACE_BYTES = int(0.5 * GiB)    # XLA temporaries and allocator slack (fitted)
MESSAGE_BUFFERS = 6                 # executor's (b, s, h) send/receive/mid/head_y buffers


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per device, for the most loaded device of the layout: the train step's parts
    (`total`), and the run's other peaks, which hold the train state but none of the step's
    temporaries: `evaluation` (the forward of one microbatch) and `save` (a checkpoint's copy
    of one array on its way to host memory, checkpoint/saving.py). `peak` is the largest.
    `host`: the pinned host memory of train.recompute=offload's pipeline stash, not the device's."""
    params: int
    grads: int
    optimizer: int
    activations: int
    workspace: int
    evaluation: int = 0
    save: int = 0
    host: int = 0

    @property
    def total(self) -> int:
        return self.params + self.grads + self.optimizer + self.activations + self.workspace

    @property
    def peak(self) -> int:
        return max(self.total, self.evaluation, self.save)

    def describe(self) -> str:
        parts = ("params", "grads", "optimizer", "activations", "workspace")
        text = " + ".join(f"{k} {getattr(self, k) / GiB:.2f}" for k in parts)
        others = (f"; evaluation {self.evaluation / GiB:.2f} and a save "
                  f"{self.save / GiB:.2f} GiB per device" if self.evaluation or self.save else "")
        host = f"; the stash's pinned host memory {self.host / GiB:.2f} GiB" if self.host else ""
        return f"{text} = {self.total / GiB:.2f} GiB per device{others}{host}"


# ----------------------------------------------------------------------------- parameters

def _tensor_sharded(names: tuple, shape: tuple, ways: dict) -> float:
    """Elements of one tensor on one device: each dim divided by the size of the mesh axis
    the rule table maps its logical axis to (ways: {'tensor': t, ZERO_AXES: d c})."""
    from ptdp_jax.parallel.sharding import LOGICAL_RULES
    n = 1.0
    for name, size in zip(names, shape):
        n *= size / ways.get(LOGICAL_RULES.get(name), 1)
    return n


def params_per_device(cfg, state: bool = False) -> dict[str, float]:
    """Parameters held by one device, by group: {'layers', 'embed', 'head'} (elements).
    Layers: the stage's padded v x max-chunk-layers slots; embed and head on every stage.
    state: as the train state holds them (parallel.zero >= 1: split over 'data' too), not as
    the model uses them."""
    from ptdp_jax.models.model import arch
    from ptdp_jax.pipeline.balance import chunk_layers
    from ptdp_jax.parallel.sharding import ZERO_AXES, zero_axes, zero_ways
    from ptdp_jax.training.state import zero_stage
    m, par = cfg.model, cfg.parallel
    split = state and zero_stage(cfg) > 0
    ways = {"tensor": par.tensor, ZERO_AXES: zero_ways(par) if split else 1}
    specs = arch(m).param_specs(m)
    counts = chunk_layers(cfg)
    layer_slots = par.virtual_stages * max(counts)
    out = {}
    for group, spec_group in (("embed", "embed"), ("layers", "layer"), ("head", "head")):
        n = sum(_tensor_sharded(zero_axes(names, shape, zero_ways(par), par.tensor) if split
                                else names, shape, ways)
                for shape, names, _ in specs[spec_group].values())
        out[group] = n * (layer_slots if group == "layers" else 1)
    return out


# ----------------------------------------------------------------------------- activations

def host_stash_bytes(cfg) -> float:
    """train.recompute=offload with pipelining: the pinned host memory of one device's stash
    (`offloaded_bytes` a layer, the schedule's slots and the trash slot x the largest chunk's
    layers); 0 otherwise."""
    if cfg.recompute != "offload" or cfg.parallel.pipe == 1:
        return 0.0
    from ptdp_jax.pipeline.balance import chunk_layers
    slots = stash_slots(cfg) + (1 if cfg.static_stash_on else 0)
    return slots * max(chunk_layers(cfg)) * offloaded_bytes(cfg)


def stash_slots(cfg) -> int:
    """Microbatch-chunk residual sets held at once on the busiest stage: the schedule's
    in-flight bound, plus the executor's trash slot for a dynamically indexed stash
    (tuning.static_stash=false); 1 without pipelining."""
    par = cfg.parallel
    if par.pipe == 1:
        return 1
    from ptdp_jax.pipeline.balance import chunk_layers
    return _stash_slots(par.schedule, par.pipe, cfg.num_microbatches, par.virtual_stages,
                        min(chunk_layers(cfg)) >= 2, cfg.stash_chunk_pools) + (
                            0 if cfg.static_stash_on else 1)


@functools.lru_cache(maxsize=1024)
def _wstash_slots(schedule: str, p: int, m: int, v: int, pools: bool = False) -> int:
    """Schedule.num_wstash_slots (zero-bubble tables: B-to-W sets held at once)."""
    from ptdp_jax.pipeline.schedule import build_schedule
    return build_schedule(schedule, p, m, v, chunk_pools=pools).num_wstash_slots


def wstash_bytes(cfg) -> float:
    """Zero-bubble tables: the W stash of the most loaded device, each GEMM's input and output
    gradient (b s (K + N) in the compute dtype; with train.fp8 one byte each, the FP8 operands)
    from B to W, for the layers of the largest chunk, in num_wstash_slots slots (indexed per
    tick: + 1, the executor's trash slot); 0 otherwise."""
    from ptdp_jax.pipeline.balance import chunk_layers
    from ptdp_jax.pipeline.schedule import ZERO_BUBBLE
    par = cfg.parallel
    if par.pipe == 1 or par.schedule not in ZERO_BUBBLE:
        return 0.0
    dtype_bytes = 1 if cfg.train.fp8 else 4 if cfg.compute_dtype == "float32" else 2
    per_layer = sum(M * (K + N) for M, K, N in layer_gemms(cfg)) * dtype_bytes
    slots = (_wstash_slots(par.schedule, par.pipe, cfg.num_microbatches, par.virtual_stages,
                           cfg.stash_chunk_pools)
             + (0 if cfg.static_stash_on else 1))       # indexed: and the trash slot
    return slots * max(chunk_layers(cfg)) * per_layer


@functools.lru_cache(maxsize=1024)
def _stash_slots(schedule: str, p: int, m: int, v: int, split: bool, pools: bool = False) -> int:
    """Schedule.num_stash_slots. 1F1B and interleaved stop growing once m reaches a few rounds
    of p (their bound is about p, Megatron's warm-up), so a bigger m is counted at m = 4p."""
    from ptdp_jax.pipeline.schedule import build_schedule
    if schedule in ("1f1b", "interleaved") and m > 4 * p:
        m = 4 * p
    return build_schedule(schedule, p, m, v, split_backward=split,
                          chunk_pools=pools).num_stash_slots


def layer_gemms(cfg) -> list[tuple[int, int, int]]:
    """(M, K, N) of a layer's forward GEMMs on one tensor rank, M = b s tokens."""
    m, t = cfg.model, cfg.parallel.tensor
    h, f = m.hidden_size, m.ffn
    T = device_tokens(cfg)
    if m.arch == "llama":       # K and V narrower under grouped-query attention (kv_heads)
        kv = getattr(m, "kv_heads", None) or m.num_heads
        kv_width = kv * (h // m.num_heads) // t
        return ([(T, h, h // t), (T, h, kv_width), (T, h, kv_width), (T, h // t, h)]
                + [(T, h, f // t)] * 2 + [(T, f // t, h)])
    return [(T, h, h // t)] * 3 + [(T, h // t, h), (T, h, f // t), (T, f // t, h)]


def _head_spread(cfg) -> bool:
    par = cfg.parallel
    return par.pipe > 1 and cfg.model.padded_vocab_size % (par.pipe * par.tensor) == 0


def activation_bytes(cfg) -> float:
    """Stash + message buffers + logits of the most loaded device."""
    from ptdp_jax.pipeline.balance import chunk_layers
    m, par, tr = cfg.model, cfg.parallel, cfg.train
    tokens = device_tokens(cfg)
    dtype_bytes = 4 if tr.dtype == "float32" else 2
    if par.pipe == 1:
        stash = m.num_layers * layer_activation_bytes_per_token(cfg) * tokens
        # zero=3's layer scan: the residuals twice (likely the stacked buffers the forward scan
        # writes and the backward scan reads); measured only there
        from ptdp_jax.training.state import zero_stage
        stash *= SCAN_RESIDUAL_COPIES if cfg.scan_layers_on and zero_stage(cfg) == 3 else 1
        buffers = 0.0
    else:
        per_layer = layer_activation_bytes_per_token(cfg) * tokens
        stash = stash_slots(cfg) * max(chunk_layers(cfg)) * per_layer
        if cfg.recompute == "offload":      # the slots keep the layer inputs; the rest is on
            kept = layer_activation_bytes_per_token(cfg, "full") * tokens      # the host
            stash = max(chunk_layers(cfg)) * (stash_slots(cfg) * kept
                                              + TRANSIT_CHUNKS * (per_layer - kept))
        # fwd/bwd receive buffers (a few slots each) and the per-tick messages, (b, s, h) each
        buffers = (2 * 2 + MESSAGE_BUFFERS) * tokens * m.hidden_size * dtype_bytes
        buffers /= par.tensor if sequence_parallel(cfg) else 1      # messages split by sequence
    return stash + wstash_bytes(cfg) + buffers + logits_bytes(cfg, _head_spread(cfg))


def logits_bytes(cfg, spread: bool) -> float:
    """The float32 logits of one microbatch the head holds at once: over the pipeline stages
    where it is spread (`pipeline/head.py`), else one chunk of the sequence at a time (the
    fused head loss, `models/fused_loss.py`)."""
    m, par = cfg.model, cfg.parallel
    vocab_share = m.padded_vocab_size / (par.tensor * (par.pipe if spread else 1))
    logits = device_tokens(cfg) * vocab_share * LOGITS_BYTES
    if not spread:
        from ptdp_jax.models.fused_loss import num_chunks
        logits /= num_chunks(cfg.train.micro_batch_size, m.seq_len, m.padded_vocab_size)
    return logits


# ----------------------------------------------------------------------------- the estimate

def state_held_bytes(cfg) -> float:
    """The train state one device holds between steps: float32 master weights and AdamW's
    moments (split over 'data' by parallel.zero >= 1), and the FP8 history."""
    from ptdp_jax.training.state import zero_stage
    from ptdp_jax.training.state_memory import (ADAM_BYTES_PER_PARAM, MASTER_BYTES_PER_PARAM,
                                                fp8_history_bytes)
    held = sum(params_per_device(cfg, state=bool(zero_stage(cfg))).values())
    return held * (MASTER_BYTES_PER_PARAM + ADAM_BYTES_PER_PARAM) + fp8_history_bytes(cfg)


def evaluation_bytes(cfg) -> float:
    """The evaluation step at its peak: the state, the weights in the compute dtype (whole,
    as the step uses them), one layer's forward of a microbatch as it runs (its `none`
    residuals, a bound), the stage messages and the logits of that microbatch (the fused head
    loss's chunk: the evaluation's head is never spread over the stages)."""
    m, par = cfg.model, cfg.parallel
    used = sum(params_per_device(cfg).values())
    weights = used * (4 if cfg.compute_dtype == "float32" else 2)
    tokens = device_tokens(cfg)
    layer = layer_activation_bytes_per_token(cfg, "none") * tokens
    dtype_bytes = 4 if cfg.compute_dtype == "float32" else 2
    messages = (2 if par.pipe > 1 else 1) * tokens * m.hidden_size * dtype_bytes
    return (state_held_bytes(cfg) + weights + layer + messages + logits_bytes(cfg, False)
            + WORKSPACE_BYTES)


def save_bytes(cfg) -> float:
    """A checkpoint's save at its peak: the state and the canonical copy of its largest array
    (the layer stack of one weight, float32), before that copy moves to host memory."""
    shapes = _canonical_shapes(cfg)
    largest = max(_tensor_sharded(names, shape, {"tensor": cfg.parallel.tensor})
                  / (cfg.parallel.pipe if layered else 1)
                  for shape, names, layered in shapes)
    return state_held_bytes(cfg) + 4 * largest + WORKSPACE_BYTES


def _canonical_shapes(cfg):
    """(shape, logical names, stacked over layers) of each parameter in canonical layout."""
    from ptdp_jax.models.model import arch
    specs = arch(cfg.model).param_specs(cfg.model)
    out = []
    for group in ("embed", "layer", "head"):
        for shape, names, _ in specs[group].values():
            if group == "layer":
                out.append(((cfg.model.num_layers,) + tuple(shape), (None,) + tuple(names), True))
            else:
                out.append((tuple(shape), tuple(names), False))
    return out


def estimate_memory(cfg) -> MemoryEstimate:
    """Bytes per device of cfg's layout (cfg: a `ptdp_jax.config.load.Config`), most loaded device."""
    from ptdp_jax.training.state import zero_stage
    from ptdp_jax.training.state_memory import state_bytes
    # one device's parameters as the model uses them, and as its train state holds them
    used = params_per_device(cfg)
    held = params_per_device(cfg, state=True) if zero_stage(cfg) else used
    params, grads, optimizer = state_bytes(cfg, used, sum(held.values()))
    workspace = WORKSPACE_BYTES + context_attention_bytes(cfg) + document_attention_bytes(cfg)
    if cfg.recompute == "full":     # one layer's full residuals while it is recomputed
        tokens = device_tokens(cfg)
        workspace += layer_activation_bytes_per_token(cfg, "none") * tokens
    workspace += activation_recompute_bytes(cfg)
    return MemoryEstimate(
        params=int(params),
        grads=int(grads),
        optimizer=int(optimizer),
        activations=int(activation_bytes(cfg)),
        workspace=int(workspace),
        evaluation=int(evaluation_bytes(cfg)),
        save=int(save_bytes(cfg)),
        host=int(host_stash_bytes(cfg)))


def device_memory_bytes(device=None) -> int | None:
    """What one device has (`config.memory_limit.device_memory_bytes`)."""
    from ptdp_jax.config.memory_limit import device_memory_bytes as have
    return have(device)


def gib(n_bytes: float) -> float:
    return n_bytes / GiB


__all__ = ["MemoryEstimate", "estimate_memory", "device_memory_bytes", "params_per_device",
           "layer_activation_bytes_per_token", "flash_attention_bytes_per_token", "stash_slots", "activation_bytes", "GiB", "gib"]
