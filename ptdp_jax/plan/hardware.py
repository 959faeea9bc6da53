"""GPU kinds for the planner: peak, memory, links, GEMM efficiency against size, and how the
training program runs on them.

A kind describes one GPU *and the program whose step times calibrated it*:

* `h100`, `h200`: ptdp_jax itself (lockstep executor, cuDNN flash attention, XLA element-wise
  kernels), calibrated on its own step times and per-kernel traces (4x H100, 2026-11-26: GEMMs
  of 17-430 GFLOP at 0.69-0.83 of the dense peak; flash attention forward 0.345, backward 0.273
  of the peak on causal FLOPs). H200 is the same GH100 chip at the same clocks: its GEMM and
  attention kernels take the H100's time, its memory-bound ones do not, so memory, the
  element-wise bandwidth, the host's per-tick gap and the datasheet bandwidth differ.
* `a100`: Megatron-LM as the paper ran it in 2021 (Narayanan et al., SC'21): each stage runs
  its op order as soon as its inputs arrive (no lockstep), unfused attention (scores and
  softmax in memory: 5 a s^2 b bytes of activations), fused element-wise kernels. Its GEMM
  efficiency curve and memory-bound factors are fitted to the paper's Table 1 (the only A100
  step times we have), so the Table 1 check tests the model's structure, not the curve.

Memory: what CUDA reports as the device's total, of which `usable_memory_fraction` is the limit
of "fits", as JAX's allocator takes it (XLA_PYTHON_CLIENT_MEM_FRACTION=0.92 as benchmarks/*.sh
set it; JAX's own default is 0.75). CUDA reports less than nvidia-smi: 615 MiB less on H200 (its
`bytes_limit`, 128.617 GiB at 0.92, 2x H200, 2026-11-29); the H100's figure is nvidia-smi's.
What a layout needs is always ptdp_jax's (`ptdp_jax/training/memory.py`), for a100 too.

Links: NCCL bus bandwidth per GPU inside a host (NVLink through NVSwitch) and across hosts
(one InfiniBand NIC per GPU: DGX A100 8x HDR 200 Gb/s, DGX H100/H200 8x NDR 400 Gb/s), with
an efficiency already applied. Every field can be overridden (`with_overrides`, and on the
command line `hw.<field>=value`, e.g. `hw.ib_bytes_per_s=2.5e10`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace

from ptdp_jax.config.decisions import MEMORY_FRACTION


@dataclass(frozen=True)
class GpuKind:
    name: str
    peak_flops: float                    # dense 16-bit FLOP/s (datasheet)
    memory_bytes: int                    # what a device holds (as CUDA reports it)
    usable_memory_fraction: float        # the share the program may take (the limit of "fits")
    hbm_bytes_per_s: float               # datasheet HBM bandwidth
    memory_bound_bytes_per_s: float      # what element-wise kernels of this program reach
    nvlink_bytes_per_s: float            # NCCL bus bandwidth per GPU inside a host
    ib_bytes_per_s: float                # per GPU across hosts (one NIC per GPU)
    nvlink_latency_s: float              # per ring step of a collective, inside a host
    tp_collective_overhead_s: float      # per tensor all-reduce beyond the ring (launch, reshards)
    ib_latency_s: float                  # per ring step across hosts
    gemm_efficiency: tuple[tuple[float, float], ...]   # (GEMM GFLOP, fraction of peak_flops)
    execution: str                       # "lockstep" (ptdp_jax) | "async" (Megatron)
    attention: str                       # "flash" | "unfused"
    flash_fwd_efficiency: float          # fraction of peak on causal FLOPs (2 b s^2 h / t)
    flash_bwd_efficiency: float          # backward: 2.5x the forward's FLOPs
    xla_attention_flops: float           # XLA's own attention, FLOP/s on the full square (ptdp_jax
                                         # uses it on (d > 1, 1, t > 1) meshes; 0: never)
    softmax_bytes_fwd: float             # unfused: bytes moved per attention score, forward
    softmax_bytes_bwd: float             # ... backward
    elementwise_bytes_fwd: float         # per token per h per layer, forward (norms, GeLU, ...)
    elementwise_bytes_bwd: float         # ... backward (without the recomputed forward)
    stash_copy_passes_fwd: float         # passes over a layer's stashed residuals, forward
    stash_copy_passes_bwd: float         # ... backward
    static_stash_copy_share: float       # of those passes, the share left with tuning.static_stash
                                         # (the transposes and slices they also absorbed)
    head_ce_passes: float                # passes over the float32 logits (cross-entropy, both ways)
    tick_overhead_s: float               # lockstep: host gap per pipeline tick
    row_overhead_s: float                # lockstep, phased schedules (one loop of rows): per row
    wgrad_accumulate_exposed: float      # pipelined: share of the float32 weight-gradient sums'
                                         # read and write (GEMM epilogue, beta 1) not hidden
    step_overhead_s: float               # per step: launch, loss, host
    optimizer_bytes_per_param: float     # AdamW update and gradient clipping, memory traffic
    grad_bytes: int                      # bytes per gradient element in the data-parallel reduction
    activation_bytes: int                # bytes per element of a stage-to-stage message
    source: str = ""
    # flash attention by sequence length: (s, forward, backward fraction of the peak on causal
    # FLOPs); below the first s, flash_fwd/bwd_efficiency; () for none
    flash_by_seq: tuple[tuple[float, float, float], ...] = ()
    packed_attention: bool = False       # cuDNN's packed layout (document masking): Hopper on

    def flash_fractions(self, s: int) -> tuple[float, float]:
        """(forward, backward) fraction of the peak flash attention reaches at sequence length
        s: flash_fwd/bwd_efficiency up to flash_by_seq's first length, then its table,
        interpolated in log(s), held beyond its end."""
        table = ((2048.0, self.flash_fwd_efficiency, self.flash_bwd_efficiency),) + tuple(
            self.flash_by_seq)
        if s <= table[0][0] or len(table) == 1:
            return table[0][1], table[0][2]
        for (s0, f0, b0), (s1, f1, b1) in zip(table, table[1:]):
            if s <= s1:
                w = (math.log(s) - math.log(s0)) / (math.log(s1) - math.log(s0))
                return f0 + w * (f1 - f0), b0 + w * (b1 - b0)
        return table[-1][1], table[-1][2]

    def gemm_fraction(self, flops: float) -> float:
        """Fraction of peak a GEMM of `flops` reaches: the table, interpolated in log(FLOPs),
        held constant beyond its ends."""
        table = self.gemm_efficiency
        g = max(flops, 1.0) / 1e9
        if g <= table[0][0]:
            return table[0][1]
        for (g0, e0), (g1, e1) in zip(table, table[1:]):
            if g <= g1:
                w = (math.log(g) - math.log(g0)) / (math.log(g1) - math.log(g0))
                return e0 + w * (e1 - e0)
        return table[-1][1]

    def gemm_seconds(self, flops: float) -> float:
        return flops / (self.gemm_fraction(flops) * self.peak_flops) if flops > 0 else 0.0


# H100 SXM, ptdp_jax: the GEMMs of 4x H100 traces (2026-11-26; 2048-token GEMMs at 0.67-0.83 of
# the peak) and an 8192^3 matmul in JAX (0.78). Below 17 GFLOP no measurement: the two smallest
# points are a roofline guess (2-3 us launch + HBM traffic).
H100_GEMM = ((1.0, 0.30), (4.0, 0.52), (17.2, 0.695), (51.5, 0.77), (68.7, 0.78),
             (430.0, 0.82), (1100.0, 0.78))
# A100, Megatron (2021): fitted to Table 1 (the GEMMs there are 30-2000 GFLOP).
A100_GEMM = ((1.0, 0.30), (4.0, 0.50), (30.0, 0.644), (300.0, 0.70))

GB = 1e9
GPU_KINDS: dict[str, GpuKind] = {
    "h100": GpuKind(
        name="h100", peak_flops=989e12, memory_bytes=81559 * 2 ** 20,
        usable_memory_fraction=MEMORY_FRACTION, hbm_bytes_per_s=3.35e12,
        memory_bound_bytes_per_s=3.35e12, nvlink_bytes_per_s=360 * GB, ib_bytes_per_s=45 * GB,
        nvlink_latency_s=6e-6, ib_latency_s=12e-6, gemm_efficiency=H100_GEMM,
        tp_collective_overhead_s=55e-6,   # fitted: (1,2,2) 0.2923 s, 4x H200, 2026-11-26
        execution="lockstep", attention="flash", flash_fwd_efficiency=0.345,
        flash_bwd_efficiency=0.273, xla_attention_flops=39e12, softmax_bytes_fwd=0.0,
        softmax_bytes_bwd=0.0,
        elementwise_bytes_fwd=41.5, elementwise_bytes_bwd=182.0,
        stash_copy_passes_fwd=4.0, stash_copy_passes_bwd=5.2, head_ce_passes=8.0,
        static_stash_copy_share=0.5,      # fitted: (1,2,1) 1f1b-phased on 2x H100, 2026-11-26
        # the host's gap a tick and a phased row: a tiny GPT's, 4x H100, 2026-11-27
        tick_overhead_s=0.39e-3, row_overhead_s=0.155e-3,
        # weight-gradient GEMMs that accumulate (beta 1) run slower than plain ones of their size
        wgrad_accumulate_exposed=0.5,
        step_overhead_s=5e-3, optimizer_bytes_per_param=48.0,
        grad_bytes=4, activation_bytes=2, packed_attention=True,
        source="ptdp_jax on 4x H100 80GB HBM3 (step times and traces of 2026-11-26)"),
    "a100": GpuKind(
        name="a100", peak_flops=312e12, memory_bytes=81920 * 2 ** 20,
        usable_memory_fraction=0.95, hbm_bytes_per_s=2.039e12,
        memory_bound_bytes_per_s=1.6e12, nvlink_bytes_per_s=230 * GB, ib_bytes_per_s=22 * GB,
        nvlink_latency_s=8e-6, ib_latency_s=15e-6, gemm_efficiency=A100_GEMM,
        tp_collective_overhead_s=0.0,
        execution="async", attention="unfused", flash_fwd_efficiency=0.0,
        flash_bwd_efficiency=0.0, xla_attention_flops=0.0, softmax_bytes_fwd=11.0,
        softmax_bytes_bwd=14.0,
        elementwise_bytes_fwd=40.0, elementwise_bytes_bwd=80.0,
        stash_copy_passes_fwd=0.0, stash_copy_passes_bwd=0.0, head_ce_passes=6.0,
        static_stash_copy_share=0.0,
        tick_overhead_s=0.0, row_overhead_s=0.0, wgrad_accumulate_exposed=0.0,
        step_overhead_s=20e-3, optimizer_bytes_per_param=40.0,
        grad_bytes=4, activation_bytes=2,
        source="Megatron-LM on DGX A100 80GB as in the paper (Table 1 fitted)"),
}
GPU_KINDS["h200"] = replace(
    GPU_KINDS["h100"], name="h200", hbm_bytes_per_s=4.8e12,
    memory_bytes=143156 * 2 ** 20,       # CUDA's total: JAX's limit at 0.92 is 128.617 GiB
                                         # (nvidia-smi: 143,771 MiB)
    # the datasheet's, as for H100: fits to 1.3B steps on 1-4 H200 gave 4.4e12-5.0e12; with it
    # predicted/measured 0.935-1.075, median 1.004 (60 cases, 2026-11-28)
    memory_bound_bytes_per_s=4.8e12,
    tick_overhead_s=0.0,
    # the same executor as on H100 (7.5B phased on 4x H200: within 1.5% with these, 2026-11-27)
    row_overhead_s=0.155e-3, wgrad_accumulate_exposed=0.5,
    # cuDNN's flash attention alone, b 1, 32 heads (8 key/value), head dim 128, bf16: forward
    # and backward at 8k-128k (1x H200, 2026-12-01); the 2k anchor is the H100 fit's
    flash_by_seq=((8192.0, 0.575, 0.511), (16384.0, 0.646, 0.524), (32768.0, 0.622, 0.536),
                  (65536.0, 0.614, 0.536), (131072.0, 0.566, 0.539)),
    source="ptdp_jax on 4x H200 (step times of 2026-11-26; element-wise refitted 2026-11-28)")


def gpu_kind(name: str) -> GpuKind:
    key = name.lower()
    if key not in GPU_KINDS:
        raise ValueError(f"--gpu {name!r} is not one of {sorted(GPU_KINDS)}")
    return GPU_KINDS[key]


def with_overrides(kind: GpuKind, overrides: dict[str, object]) -> GpuKind:
    """`kind` with fields replaced: {'ib_bytes_per_s': 2.5e10, ...} (values as numbers or
    strings); a key that is not a field raises ValueError naming the fields."""
    types = {f.name: f.type for f in fields(GpuKind)}
    out = {}
    for key, value in overrides.items():
        if key not in types or key == "gemm_efficiency":
            raise ValueError(f"hw.{key} is not a GPU kind field; fields are "
                             f"{sorted(k for k in types if k != 'gemm_efficiency')}")
        current = getattr(kind, key)
        try:
            out[key] = type(current)(float(value) if isinstance(current, (int, float))
                                     and not isinstance(current, bool) else value)
        except (TypeError, ValueError):
            raise ValueError(f"hw.{key}={value!r} is not a {type(current).__name__}") from None
    return replace(kind, **out)


def detect_gpu_kind(device=None) -> GpuKind:
    """The kind of a jax device (None: the first local one) from its device_kind ('NVIDIA
    H100 80GB HBM3' -> h100, ...), with memory_bytes from `memory.device_memory_bytes` when the
    device reports it (a limit already: usable_memory_fraction 1). Unknown kinds (CPU included)
    plan as h100 with the device's memory."""
    import jax

    from ptdp_jax.training.memory import device_memory_bytes
    dev = device if device is not None else jax.local_devices()[0]
    text = str(getattr(dev, "device_kind", "")).lower()
    kind = next((GPU_KINDS[k] for k in ("h200", "h100", "a100") if k in text), GPU_KINDS["h100"])
    memory = device_memory_bytes(dev)
    return replace(kind, memory_bytes=memory, usable_memory_fraction=1.0) if memory else kind
