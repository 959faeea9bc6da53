"""Enumerate the layouts of a model on n GPUs, reject the impossible ones with a reason, predict
the rest, rank them.

A layout: data x pipe x context x tensor = n (context c where 2c divides the sequence and
dropout is off: parallel/context.py), micro batch b, schedule (1f1b, interleaved with v virtual
stages, gpipe on request), recompute (none, selective, full), scatter/gather (p > 1, t > 1),
parallel.zero (d c > 1: 0-3 without pipelining, 0 and 1 with it, where 2 and 3 gather a stage's
weights once a step as 1 does).
Rejected, with the reason in words:

    not divisible        t into heads / FFN / padded vocabulary, p x v into the layers, d x b
                         into the global batch, m into p for the interleaved schedule
    tensor across hosts  t > GPUs per host (the paper: keep t inside a node)
    does not fit         the memory estimate (ptdp_jax.training.memory) above the device's memory
                         (no step time is predicted for these)

Ranked by predicted step time (the global batch is fixed, so tokens/s ranks the same); the
recommended layout is the fastest that is not rejected. Keys that the caller pins (`fixed`: the
user's explicit overrides) are not searched.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ptdp_jax.config.load import ConfigError, ParallelConfig
from ptdp_jax.config.validation import validate
from ptdp_jax.training.memory import GiB, MemoryEstimate, estimate_memory, params_per_device
from ptdp_jax.plan.estimate import StepEstimate, estimate_step, on_gpus
from ptdp_jax.plan.hardware import GpuKind, detect_gpu_kind, gpu_kind

LAYOUT_KEYS = ("parallel.data", "parallel.pipe", "parallel.tensor", "parallel.context",
               "train.micro_batch_size",
               "parallel.schedule", "parallel.virtual_stages", "train.recompute",
               "parallel.scatter_gather", "parallel.zero", "parallel.sequence_parallel",
               "tuning.keep_ffn_activation")
MICRO_BATCHES = (1, 2, 4, 8, 16, 32)      # tried where they divide the batch of a replica
RECOMPUTES = ("none", "selective", "full")
SCHEDULES = ("1f1b", "1f1b-phased", "zb-phased", "interleaved")   # gpipe: never faster than
#   1f1b, m slots; zb-h1, zb-v: slower where measured
LOCKSTEP_ONLY = ("zb-phased",)         # searched only for our executor's GPU kinds
PHASED = ("1f1b-phased", "zb-phased")  # v > 1 searched only for our executor's GPU kinds too
#   (1.3B v 2 -3.9%, 7.5B v 3 -2.7% against v 1, 4x H200, 2026-11-27), up to
PHASED_MAX_V = 4                       # (the compile grows with the chunks; measured to v 3)
MAX_VIRTUAL_STAGES = 8
ZEROS = (0, 1, 2, 3)                      # parallel.zero, tried where d > 1 (see _zeros)
DEFAULT_TOKENS = 300e9                    # the paper's GPT-3 example


@dataclass(frozen=True)
class Candidate:
    data: int
    pipe: int
    tensor: int
    micro_batch_size: int
    schedule: str
    virtual_stages: int
    recompute: str
    scatter_gather: bool
    num_microbatches: int
    zero: int = 0                         # parallel.zero
    sequence_parallel: bool = False       # parallel.sequence_parallel (t > 1)
    keep_ffn_activation: bool | str = "auto"  # selective: False where keeping it does not fit
    context: int = 1                      # parallel.context
    reason: str = ""                      # "" = a valid layout
    fits: bool = False
    params_per_device: float = 0.0         # parameters held by the most loaded device
    memory: MemoryEstimate | None = None    # per device (ptdp_jax.training.memory), where it was estimated
    estimate: StepEstimate | None = None   # the predicted step, for layouts that fit
    tokens: float = DEFAULT_TOKENS
    tokens_per_step: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.reason

    def overrides(self) -> dict:
        """The layout as dotted config overrides."""
        return {"parallel.data": self.data, "parallel.pipe": self.pipe,
                "parallel.tensor": self.tensor, "parallel.context": self.context,
                "train.micro_batch_size": self.micro_batch_size,
                "parallel.schedule": self.schedule, "parallel.virtual_stages": self.virtual_stages,
                "train.recompute": self.recompute, "parallel.scatter_gather": self.scatter_gather,
                "parallel.zero": self.zero, "parallel.sequence_parallel": self.sequence_parallel,
                "tuning.keep_ffn_activation": self.keep_ffn_activation}

    def to_json(self) -> dict:
        e, mem = self.estimate, self.memory
        g = (lambda x: round(x / GiB, 3)) if mem else (lambda x: None)
        return {
            "data": self.data, "pipe": self.pipe, "tensor": self.tensor, "context": self.context,
            "micro_batch_size": self.micro_batch_size, "num_microbatches": self.num_microbatches,
            "schedule": self.schedule, "virtual_stages": self.virtual_stages,
            "recompute": self.recompute, "scatter_gather": self.scatter_gather,
            "zero": self.zero, "sequence_parallel": self.sequence_parallel,
            "keep_ffn_activation": self.keep_ffn_activation,
            "fits": self.fits, "reason": self.reason,
            "params_per_device": int(self.params_per_device) if mem else None,
            "memory_per_device_gib": g(mem.peak) if mem else None,
            "weights_gib": g(mem.params) if mem else None,
            "grads_gib": g(mem.grads) if mem else None,
            "optimizer_gib": g(mem.optimizer) if mem else None,
            "activations_gib": g(mem.activations) if mem else None,
            "workspace_gib": g(mem.workspace) if mem else None,
            "bubble": round(e.bubble, 4) if e else None,
            "step_time_s": round(e.step_time_s, 5) if e else None,
            "tflops_per_gpu": round(e.tflops_per_gpu, 1) if e else None,
            "days": round(e.days(self.tokens, self.tokens_per_step), 2) if e else None,
            "dp_allreduce_s": round(e.dp_allreduce_s, 5) if e else None,
        }


# ----------------------------------------------------------------------------- enumeration

def _divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def _tensor_reason(model, t: int, gpus_per_host: int) -> str:
    if model.num_heads % t:
        return f"not divisible: model.num_heads={model.num_heads} by t={t}"
    kv = getattr(model, "kv_heads", None)
    if kv and kv % t:
        return f"not divisible: model.kv_heads={kv} by t={t}"
    if model.ffn % t:
        return f"not divisible: FFN size {model.ffn} by t={t}"
    if model.padded_vocab_size % t:
        return f"not divisible: padded vocabulary {model.padded_vocab_size} by t={t}"
    if t > gpus_per_host:
        return f"tensor across hosts: t={t} > {gpus_per_host} GPUs per host"
    return ""


def _layouts(cfg, n: int, gpus_per_host: int, fixed: dict, micro_batches, recomputes, schedules,
             lockstep: bool = True):
    """Yield (Candidate without estimate, cfg of the layout or None)."""
    model, B, L = cfg.model, cfg.train.global_batch_size, cfg.model.num_layers

    def pick(key, options):
        return [fixed[key]] if key in fixed else list(options)

    for ctx, t, p in _splits(cfg, n, pick, lockstep):
        d = n // (ctx * t * p)
        if "parallel.data" in fixed and fixed["parallel.data"] != d:
            continue
        treason = _tensor_reason(model, t, gpus_per_host) or _context_reason(cfg, ctx)
        base = dict(data=d, pipe=p, tensor=t, context=ctx)
        row = model.seq_len // (2 * ctx) if ctx > 1 else model.seq_len   # a device's rows
        if B % d:
            yield Candidate(**base, micro_batch_size=0, schedule="-", virtual_stages=1,
                            recompute="-", scatter_gather=False, num_microbatches=0,
                            reason=f"not divisible: global batch {B} by d={d}"), None
            continue
        divides = [b for b in micro_batches if (B // d) % b == 0]
        for b in pick("train.micro_batch_size", divides):
            if (B // d) % b:
                yield Candidate(**base, micro_batch_size=b, schedule="-", virtual_stages=1,
                                recompute="-", scatter_gather=False, num_microbatches=0,
                                reason=f"not divisible: global batch {B} by d x b = "
                                       f"{d} x {b}"), None
                continue
            m = B // (d * b)
            for sched, v in _schedules(p, L, fixed, schedules, lockstep):
                tensor_hard = "" if treason.startswith("tensor across hosts") else treason
                hard = tensor_hard
                if not hard and L % (p * v):
                    hard = f"not divisible: model.num_layers={L} by p x v = {p} x {v}"
                if not hard and (sched == "interleaved" or v > 1) and m % p:
                    hard = f"not divisible: {sched} v={v} needs m % p == 0, m={m}, p={p}"
                for rc in pick("train.recompute", recomputes):
                    sgs = [False, True] if (p > 1 and t > 1) else [False]
                    for sg in pick("parallel.scatter_gather", sgs):
                        for z, sp in _zero_sp(d * ctx, p, t, row, pick):
                            why = tensor_hard or _sp_reason(sp, t, row) or hard
                            c = Candidate(**base, micro_batch_size=b, schedule=sched,
                                          virtual_stages=v, recompute=rc, scatter_gather=sg,
                                          num_microbatches=m, zero=z, sequence_parallel=sp,
                                          reason=why or treason,
                                          keep_ffn_activation=_keep(cfg, fixed, rc))
                            # a tensor group across hosts is slow, not impossible
                            # (tuning.allow_cross_host_tensor): still predicted
                            yield c, None if why else layout_config(cfg, c)


def _splits(cfg, n: int, pick, ours: bool):
    """(context, tensor, pipe) whose product divides n: context (ours: our executor's GPU
    kinds) where 2c divides the sequence and dropout is off (or pinned), tensor and pipe any
    divisors."""
    s = cfg.model.seq_len
    contexts = [c for c in _divisors(n) if c == 1 or (
        ours and s % (2 * c) == 0 and not cfg.model.dropout)]
    for c in pick("parallel.context", contexts):
        for t in pick("parallel.tensor", _divisors(n // c) if n % c == 0 else []):
            for p in pick("parallel.pipe", _divisors(n // (c * t)) if n % (c * t) == 0 else []):
                if n % (c * t * p) == 0:
                    yield c, t, p


def _context_reason(cfg, c: int) -> str:
    """A pinned parallel.context the sequence or the dropout rules out."""
    if c > 1 and cfg.model.seq_len % (2 * c):
        return f"not divisible: model.seq_len={cfg.model.seq_len} by 2 x parallel.context = {2 * c}"
    if c > 1 and cfg.model.dropout:
        return f"context parallelism needs model.dropout=0, got {cfg.model.dropout}"
    return ""


def _zero_sp(d: int, p: int, t: int, seq_len: int, pick):
    """(parallel.zero, parallel.sequence_parallel) pairs to price (d: the replicas of the
    weights, data x context): sequence parallelism both ways where t > 1 divides the sequence
    (it is a no-op at t = 1)."""
    sps = [False, True] if t > 1 and seq_len % t == 0 else [False]
    return [(z, sp) for z in pick("parallel.zero", _zeros(d, p))
            for sp in pick("parallel.sequence_parallel", sps)]


def _sp_reason(sp: bool, t: int, seq_len: int) -> str:
    """A pinned sequence parallelism the sequence cannot be split for."""
    if sp and t > 1 and seq_len % t:
        return f"not divisible: model.seq_len={seq_len} by t={t} (parallel.sequence_parallel)"
    return ""


def _keep(cfg, fixed: dict, recompute: str) -> bool | str:
    """tuning.keep_ffn_activation of a candidate: the pinned or configured value under
    selective; otherwise auto (true needs selective)."""
    keep = fixed.get("tuning.keep_ffn_activation", cfg.tuning.keep_ffn_activation)
    return keep if recompute == "selective" or keep is False else "auto"


def _zeros(d: int, p: int) -> tuple[int, ...]:
    """parallel.zero values worth pricing: none with one replica of the weights; with pipelining 2
    and 3 gather a stage's weights once a step, as 1 does (the same step and memory)."""
    return (0,) if d == 1 else (0, 1) if p > 1 else ZEROS


def _schedules(p: int, L: int, fixed: dict, schedules, lockstep: bool):
    if p == 1:
        return [(fixed.get("parallel.schedule", "1f1b"), 1)]
    out = []
    for name in ([fixed["parallel.schedule"]] if "parallel.schedule" in fixed else schedules):
        if name == "interleaved":
            vs = [fixed["parallel.virtual_stages"]] if "parallel.virtual_stages" in fixed else [
                v for v in range(2, MAX_VIRTUAL_STAGES + 1) if L % (p * v) == 0]
            out += [(name, v) for v in vs]
        elif name == "zb-v":                    # two chunks per stage, in a V
            out.append((name, 2))
        elif name in PHASED:
            vs = [fixed["parallel.virtual_stages"]] if "parallel.virtual_stages" in fixed else [
                v for v in range(1, (PHASED_MAX_V if lockstep else 1) + 1)
                if v == 1 or L % (p * v) == 0]
            out += [(name, v) for v in vs]
        else:
            out.append((name, 1))
    return out


def layout_config(cfg, c: Candidate):
    """cfg with the candidate's layout (stage_layers reset: the planner splits evenly)."""
    return replace(cfg, parallel=replace(cfg.parallel, data=c.data, pipe=c.pipe, tensor=c.tensor,
                                         context=c.context, schedule=c.schedule, virtual_stages=c.virtual_stages,
                                         scatter_gather=c.scatter_gather, zero=c.zero,
                                         sequence_parallel=c.sequence_parallel, stage_layers=()),
                   train=replace(cfg.train, micro_batch_size=c.micro_batch_size,
                                 recompute=c.recompute),
                   tuning=replace(cfg.tuning, keep_ffn_activation=c.keep_ffn_activation))


# ----------------------------------------------------------------------------- the plan

def over(need: float, limit: float) -> str:
    """'A GiB > B GiB' with as many decimals (1 to 4) as it takes for A and B to differ: a
    layout 0.01 GiB over its limit is not shown as '128.6 GiB > 128.6 GiB'."""
    a, b = need / GiB, limit / GiB
    digits = next((d for d in range(1, 4) if f"{a:.{d}f}" != f"{b:.{d}f}"), 4)
    return f"{a:.{digits}f} GiB > {b:.{digits}f} GiB"


def check_inputs(cfg, num_gpus: int, gpus_per_host: int, tokens: float = DEFAULT_TOKENS) -> None:
    """ConfigError naming the key and numbers for input no layout can fix."""
    if not isinstance(num_gpus, int) or num_gpus < 1:
        raise ConfigError(f"--gpus must be a positive integer, got {num_gpus!r}")
    if not isinstance(gpus_per_host, int) or gpus_per_host < 1:
        raise ConfigError(f"--gpus-per-host must be a positive integer, got {gpus_per_host!r}")
    if not (0 < tokens < math.inf):
        raise ConfigError(f"--tokens must be a positive number of training tokens (e.g. "
                          f"300e9), got {tokens:g}")
    B = cfg.train.global_batch_size
    if B < 1:
        raise ConfigError(f"train.global_batch_size (--batch) must be positive, got {B}")
    # the model section, with a layout that is always valid
    validate(replace(cfg, parallel=ParallelConfig(), train=replace(cfg.train, micro_batch_size=1)))


def plan(cfg, num_gpus: int, gpu: GpuKind | str = "h100", gpus_per_host: int = 8,
         tokens: float = DEFAULT_TOKENS, fixed: dict | None = None,
         micro_batches=MICRO_BATCHES, recomputes=RECOMPUTES, schedules=SCHEDULES,
         documents=None) -> list[Candidate]:
    """Every layout of cfg's model and global batch on num_gpus devices of kind `gpu`, the
    recommended first (then the other valid ones by step time, then the rejected ones).
    fixed: dotted layout keys (LAYOUT_KEYS) the caller pins. documents: the data's, where
    document masking is on (plan/documents.py; None: masked attention priced as causal)."""
    gpu = gpu_kind(gpu) if isinstance(gpu, str) else gpu
    if gpu.execution != "lockstep":     # Megatron (the paper's A100 model) has no zb-phased
        schedules = tuple(s for s in schedules if s not in LOCKSTEP_ONLY)
    cfg = on_gpus(cfg)
    check_inputs(cfg, num_gpus, gpus_per_host, tokens)
    fixed = {k: v for k, v in (fixed or {}).items() if k in LAYOUT_KEYS and v != "auto"}
    b = fixed.get("train.micro_batch_size")
    B = cfg.train.global_batch_size
    if b is not None and B % b:
        raise ConfigError(f"train.global_batch_size={B} (--batch) is not divisible by "
                          f"train.micro_batch_size={b}")
    limit = gpu.memory_bytes * gpu.usable_memory_fraction
    tokens_per_step = float(B * cfg.model.seq_len)
    rows = []
    for c, lcfg in _layouts(cfg, num_gpus, gpus_per_host, fixed, micro_batches, recomputes,
                            schedules, gpu.execution == "lockstep"):
        c = replace(c, tokens=tokens, tokens_per_step=tokens_per_step)
        if lcfg is None:
            rows.append(c)
            continue
        mem = estimate_memory(lcfg)
        c = replace(c, params_per_device=sum(params_per_device(lcfg).values()))
        if mem.peak > limit and lcfg.remat == "selective+act" and \
                "tuning.keep_ffn_activation" not in fixed:    # selective, the activation run again
            c = replace(c, keep_ffn_activation=False)
            lcfg = layout_config(cfg, c)
            mem = estimate_memory(lcfg)
        if mem.peak > limit:
            rows.append(replace(c, memory=mem, reason=c.reason or (
                f"does not fit: {over(mem.peak, limit)} per device")))
            continue
        rows.append(replace(c, memory=mem, fits=True,
                            estimate=estimate_step(lcfg, gpu, gpus_per_host, documents)))
    if not rows:
        raise ConfigError(f"no layout of --gpus {num_gpus} matches the pinned keys {fixed}")

    def key(c: Candidate):
        group = 0 if c.ok else 1 if c.estimate is not None else 2 if c.memory else 3
        return (group, c.estimate.step_time_s if c.estimate else 0.0,
                c.memory.peak if c.memory else 0)
    return sorted(rows, key=key)


def best_layout(cfg, num_devices: int, gpus_per_host: int, gpu: GpuKind | str | None = None,
                fixed: dict | None = None, documents=None) -> Candidate:
    """The planner's best layout for the devices at hand (with its predicted step and memory).
    fixed: the user's explicit keys, which are not searched. gpu: a kind, its name, or None for
    the kind of jax's first local device (`hardware.detect_gpu_kind`, with that device's
    memory). documents: see `plan`. Raises ConfigError when no layout is valid (naming the
    best and why it failed)."""
    if gpu is None:
        gpu = detect_gpu_kind()
    best = plan(cfg, num_devices, gpu, gpus_per_host, fixed=fixed, documents=documents)[0]
    if not best.ok:
        raise ConfigError(f"the planner: no layout of model.num_layers="
                          f"{cfg.model.num_layers}, train.global_batch_size="
                          f"{cfg.train.global_batch_size} is valid on {num_devices} devices; the "
                          f"best, (data, pipe, tensor) = ({best.data}, {best.pipe}, "
                          f"{best.tensor}), is rejected: {best.reason}")
    return best


def choose_layout(cfg, num_devices: int, gpus_per_host: int, gpu: GpuKind | str | None = None,
                  fixed: dict | None = None) -> dict:
    """best_layout as dotted overrides: parallel.data, .pipe, .tensor, .schedule,
    .virtual_stages, .scatter_gather, .zero, train.micro_batch_size, train.recompute and
    tuning.keep_ffn_activation (stage_layers is left to the config: the planner splits
    evenly); the fixed keys come back unchanged."""
    out = best_layout(cfg, num_devices, gpus_per_host, gpu, fixed).overrides()
    out.update({k: v for k, v in (fixed or {}).items() if k in out and v != "auto"})
    return out


def rejected_summary(rows: list[Candidate]) -> dict[str, int]:
    """Count of rejected layouts by the kind of reason (the words before ':')."""
    out: dict[str, int] = {}
    for c in rows:
        if c.reason:
            k = c.reason.split(":")[0]
            out[k] = out.get(k, 0) + 1
    return out


