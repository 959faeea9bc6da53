"""The predicted step of one layout: the pipeline played from its tick table, plus the per-step
reductions and the optimizer; memory per device, bubble, TFLOP/s per GPU, days for T tokens.

    est = estimate_step(cfg, gpu_kind("h100"), gpus_per_host=8)
    est.step_time_s, est.tflops_per_gpu, est.bubble, est.memory.total

TFLOP/s per GPU counts model FLOPs the paper's way: with full recomputation the extra forward is
counted (Table 1's convention, F = 96 B s l h^2 (...)); otherwise the usual 72 B s l h^2 (...)
(`metrics.model_flops_per_iteration`). Days for T tokens: T / (B s) steps of the predicted step.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ptdp_jax.config import decisions as D
from ptdp_jax.training.memory import MemoryEstimate, estimate_memory
from ptdp_jax.plan.documents import attention_share
from ptdp_jax.training.metrics import SECONDS_PER_DAY, model_flops_per_iteration
from ptdp_jax.pipeline.balance import chunk_layers, chunk_placement
from ptdp_jax.pipeline.head import spread_over_pipe
from ptdp_jax.pipeline.schedule import PHASED, ZERO_BUBBLE
from ptdp_jax.plan.cost import (accumulate_seconds, dp_allreduce_seconds, fp8_weight_seconds,
                                op_costs, optimizer_seconds, pipe_allreduce_seconds)
from ptdp_jax.plan.hardware import GpuKind
from ptdp_jax.plan.play import async_seconds, lockstep_seconds


@dataclass(frozen=True)
class StepEstimate:
    step_time_s: float
    pipeline_s: float          # forward and backward of all microbatches (the played table)
    ideal_pipeline_s: float    # the busiest stage's own work, no bubble
    bubble: float              # ops of the played table / the busiest stage's ops - 1
    dp_allreduce_s: float
    pipe_allreduce_s: float
    optimizer_s: float         # AdamW, zero 0/1 gradient accumulation without pipelining, and
                               # the FP8 weights' rounding (once a step)
    overhead_s: float
    ticks: float               # lockstep ticks (or async ops) of the table
    memory: MemoryEstimate
    model_flops: float         # per iteration (see module docstring)
    num_gpus: int

    @property
    def tflops_per_gpu(self) -> float:
        return self.model_flops / (self.step_time_s * self.num_gpus) / 1e12

    def days(self, tokens: float, tokens_per_step: float) -> float:
        return tokens / tokens_per_step * self.step_time_s / SECONDS_PER_DAY


def pipeline_seconds(cfg, gpu: GpuKind, gpus_per_host: int,
                     documents=None) -> tuple[float, float, float, float]:
    """(played pipeline seconds, ideal seconds of the busiest stage, bubble, ticks) of one step.
    bubble: the played ops (lockstep: without the per-tick costs) over the busiest stage's own
    ops, minus 1 -- the paper's (p-1)/m, or (p-1)/(v m), when ops cost what the theory says."""
    par, m = cfg.parallel, cfg.num_microbatches
    c = op_costs(cfg, gpu, gpus_per_host, documents)
    L = cfg.model.num_layers
    if par.pipe == 1:
        per_mb = L * (c.layer_fwd + c.layer_bwd) + c.head_fwd + c.head_bwd + c.embed_bwd
        return m * per_mb, m * per_mb, 0.0, 0.0
    p, v = par.pipe, par.virtual_stages
    counts = tuple(chunk_layers(cfg))
    last = p * v - 1
    head = c.head_fwd + c.head_bwd
    place = chunk_placement(cfg)
    stage_layers = max(sum(n for n, (i, _) in zip(counts, place) if i == s)
                       for s in range(p))                      # the busiest stage's layers
    if gpu.execution == "lockstep":
        spread = spread_over_pipe(cfg)
        split = min(counts) >= 2
        unit = c.layer_fwd
        units = {"head": 0.0 if spread else head / unit, "embed": c.embed_bwd / unit,
                 "bwd": c.layer_bwd / unit}
        # every tick: the host's gap and both permutes; a head tick: 1/p of the head on every
        # stage and the two (b, s, h) reductions over 'pipe'
        gap = gpu.row_overhead_s if par.schedule in PHASED else gpu.tick_overhead_s
        per_tick = gap + 2 * c.message
        played, ticks = lockstep_seconds(par.schedule, p, m, v, split, counts, units, unit,
                                         per_tick)
        ops = played - ticks * per_tick
        head_tick = head / p + 2 * c.message if spread else 0.0
        ideal_ops = m * (stage_layers * (c.layer_fwd + c.layer_bwd) + (0.0 if spread else head))
        return (played + m * head_tick, ideal_ops + m * head_tick, ops / ideal_ops - 1, ticks)
    op_s = {}
    zero_bubble = par.schedule in ZERO_BUBBLE      # backward split: B (input), W (weights)
    for chunk, n in enumerate(counts):
        head_bwd = c.head_bwd if chunk == last else 0.0
        embed_bwd = c.embed_bwd if chunk == 0 else 0.0
        op_s["F", chunk] = n * c.layer_fwd + (c.head_fwd if chunk == last else 0.0)
        if zero_bubble:     # a layer's input and weight gradients: half its backward each
            op_s["B", chunk] = n * c.layer_bwd / 2 + head_bwd
            op_s["W", chunk] = n * c.layer_bwd / 2 + embed_bwd
        else:
            op_s["B", chunk] = n * c.layer_bwd + head_bwd + embed_bwd
    played, ops = async_seconds(par.schedule, p, m, v, op_s, c.message)
    ideal = m * (stage_layers * (c.layer_fwd + c.layer_bwd) + head)
    return played, ideal, played / ideal - 1, ops


def on_gpus(cfg):
    """cfg with train.dtype=auto resolved for GPUs, the planner's devices (decisions.dtype)."""
    if cfg.train.dtype != "auto":
        return cfg
    return replace(cfg, train=replace(cfg.train, dtype=D.dtype("auto", "gpu")))


def estimate_step(cfg, gpu: GpuKind, gpus_per_host: int, documents=None) -> StepEstimate:
    """The predicted step of cfg's layout (cfg.parallel: data, pipe, tensor, schedule,
    virtual_stages, scatter_gather; cfg.train: global and micro batch, recompute).
    documents: the data's, where document masking is on (plan/documents.py), else None."""
    cfg = on_gpus(cfg)
    par = cfg.parallel
    played, ideal, bubble, ticks = pipeline_seconds(cfg, gpu, gpus_per_host, documents)
    dp = dp_allreduce_seconds(cfg, gpu, gpus_per_host)
    pp = pipe_allreduce_seconds(cfg, gpu, gpus_per_host)
    opt = (optimizer_seconds(cfg, gpu) + accumulate_seconds(cfg, gpu)
           + fp8_weight_seconds(cfg, gpu))
    step = played + dp + pp + opt + gpu.step_overhead_s
    flops = model_flops_per_iteration(cfg, cfg.recompute == "full", attention_share(documents))
    return StepEstimate(step, played, ideal, bubble, dp, pp, opt, gpu.step_overhead_s, ticks,
                        estimate_memory(cfg), flops, par.num_devices)
