"""Per-op time model of one layout: seconds per microbatch for a layer's forward and backward,
the head, the stage-to-stage message, and the per-step reductions. Pure functions of a
`Config` (its model, train and parallel sections) and a `GpuKind`.

Compute, per layer and microbatch of b sequences (T = b s tokens), on one of t tensor ranks:

    GEMMs      GPT: T x h -> 3h/t (QKV), T x h/t -> h (out), T x h -> f/t, T x f/t -> h
               (LLaMA: Q, K, V, O, gate, up, down); 2 M K N FLOPs each, at the kind's
               efficiency for that size; backward: the input and the weight gradient, 2x.
    attention  flash: causal FLOPs 2 T s h / t at flash_fwd_efficiency (backward 2.5x the
               FLOPs at flash_bwd_efficiency); unfused (Megatron 2021): the full square
               4 T s h / t as GEMMs plus softmax_bytes per score (b a/t s^2) in memory.
    element-   elementwise_bytes x T x h in memory (norms, GeLU, bias, dropout, residual), 10/34
    wise       of it replicated over t and 24/34 split (Korthikanti et al.'s activation split),
               plus stash copies: passes x the layer's stashed residuals (ptdp_jax's executor
               with tuning.static_stash off writes them into a slot in the forward and reads
               them in the backward; with it on, a fitted share of those passes is left).
    FP8        (train.fp8) the layer GEMMs at FP8_GEMM_SPEEDUP x their bf16 rate, plus the
               quantization passes in memory: FP8_QUANT_BYTES per operand element (amax read,
               scaled read, FP8 write) of each GEMM's input, and of its output gradient in
               the backward (selective quantizes the inputs again); the weights once a step
               (`fp8_weight_seconds`).
    recompute  none: nothing; selective: element-wise again in the backward, and attention
               unless it is a flash kernel (whose output selective keeps); offload:
               selective's, and OFFLOAD_EXPOSED of the copies to the host and back;
               full: the whole forward again, tensor all-reduces included.

Communication (ring algorithms, NCCL bus bandwidths of the kind):

    tensor     2 all-reduces of T h activations forward, 2 backward (Megatron's f and g), inside
               a host over NVLink, over InfiniBand when t spans hosts. Where the tensor ring
               runs (`tuning.tp_comm_overlap`, models/tp_overlap.py) the permutes hide under
               the GEMMs and what is left (per-block slices and sums, each ring's last hop)
               costs `tp_ring_share(t)` of those collectives.
    pipeline   one T h message per stage boundary and direction; scatter/gather sends 1/t of it
               and all-gathers it over NVLink on arrival; NVLink when both stages share a host.
    data       one all-reduce of the device's gradients per step, ring over d (in
               parallel.grad_reduce_dtype); with parallel.zero the all-gathers and
               reduce-scatters instead (`dp_allreduce_seconds`); the ring's inter-host
               bandwidth is the NICs of the group's GPUs on one host.
    pipe       ptdp_jax all-reduces the embedding and head gradients over 'pipe' (every stage
               holds them); Megatron the tied embedding between first and last stage.
    context    (parallel.context = c) a device's tokens are 1/c of a microbatch's and so is its
               share of the causal attention (the chunks' balance); each layer all-gathers the
               key/value heads forward, and again in the backward with a reduce-scatter of
               their gradients (`context_seconds`); the gradients are reduced over context too
               (ZeRO: gathered and reduce-scattered over data x context together).
               A rank's attention runs in cuDNN parts (parallel/context.py) at
               1 / CONTEXT_PARTS_SLOWDOWN of the whole sequence's flash attention.
    documents  data.document_mask: cuDNN's packed layout (parallel/packed.py, Hopper on)
               given the data's documents (plan/documents.py): their share of the causal
               pairs at the kernel's efficiency for their length, plus PACKED_CALL_PASSES
               over the device's query, key and value heads (float32) a call; without them,
               priced as causal attention, an upper bound. Elsewhere the tiled kernel
               (parallel/flash.py) runs, at 1 / TILED_SLOWDOWN of flash attention.

Devices are placed tensor fastest, then data, then pipe (Megatron's order and ptdp_jax's
multi-host mesh), `gpus_per_host` to a host.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ptdp_jax.training.activation_memory import (device_tokens, flash_attention_bytes_per_token,
                                                 layer_activation_bytes_per_token,
                                                 offloaded_bytes)
from ptdp_jax.training.memory import layer_gemms, params_per_device
from ptdp_jax.plan.hardware import GpuKind

REPLICATED_SHARE = 10 / 34      # element-wise work on (b, s, h) tensors every tensor rank repeats
# train.fp8: cuBLASLt FP8 GEMMs against bf16 ones, fitted on 1x H200 (2026-11-28): the LLaMA-7B
# shape with 8 layers (FP8 0.2293 s selective, 0.2271 s none) and the 1.3B GPT (0.4058 s none),
# each predicted within 3%
FP8_GEMM_SPEEDUP = 1.75
FP8_QUANT_BYTES = 5             # per operand element: amax read (2), scaled read (2), write (1)
# parallel/flash.py's tiled kernel against cuDNN's flash attention, forward and backward:
# 16.1x, 17.4x and 17.1x at 8k, 16k and 32k (b 1, 32 heads, 8 kv heads, 1x H200, 2026-12-01)
TILED_SLOWDOWN = 16.9
# a context rank's attention in cuDNN parts against 1/c of the whole sequence's: 1.01-1.12x
# at 32k-128k with c = 2, 4, 8 (b 1, 32 heads, 8 kv heads, 1x H200, 2026-12-02)
CONTEXT_PARTS_SLOWDOWN = 1.06
# train.recompute=offload: device <-> pinned host memory (PCIe 5 x16) and the share of those
# copies the layers' compute does not hide, fitted: LLaMA-3-8B shape, 4 layers, 32k and 64k,
# offload 1.9524 and 4.8785 s against selective's 1.3729 and 3.6172 s (1x H200, 2026-12-02)
# document masking in cuDNN's packed layout: a call's merges of its output and gradients into
# the whole sequence's, passes over the device's (q + k + v heads) x head_dim float32 values,
# (forward, backward); fitted: LLaMA-3-8B shape, 4 layers, selective, the embedded corpus,
# masked 1.1480 and 2.7264 s at 32k and 128k (1x H200, 2026-12-03)
PACKED_CALL_PASSES = (4.0, 10.0)
HOST_LINK_BYTES_PER_S = 50e9
OFFLOAD_EXPOSED = 0.47
# ... with pipelining (pipeline/host_stash.py: every tick copies an entry each way, and the
# copies of one host buffer run in turn), fitted: the executor on one GPU (p = 1), gpipe,
# 8 microbatches of 16k, 9.2783 s against selective's 2.4663 s (1x H200, 2026-12-04)
OFFLOAD_EXPOSED_PIPELINED = 3.44


def tp_ring_share(t: int) -> float:
    """What the tensor ring costs, as a share of the collectives it replaces: (t - 1) / t,
    fitted to the 1.3B's ring against plain sequence parallelism (ring / plain 0.91-0.94,
    predicted 0.93-0.94, on 4x H100 and 2x H200, 2026-11-28). Applied at m = 1 only, where
    `auto` turns the ring on and where it was fitted (at m = 4 it ran level with plain)."""
    return (t - 1) / t


@dataclass(frozen=True)
class OpCosts:
    """Seconds per microbatch on one device of the layout (one tensor rank)."""
    layer_fwd: float          # one layer's forward (tensor all-reduces included)
    layer_bwd: float          # one layer's backward, recomputation included
    head_fwd: float           # logits GEMM + cross-entropy, whole vocabulary share of one device
    head_bwd: float
    embed_bwd: float          # embedding gradient (scatter-add)
    message: float            # one stage-to-stage message (scatter/gather applied)
    tp_allreduce: float       # one tensor all-reduce of T h activations (or what the ring costs)


# ----------------------------------------------------------------------------- collectives

def ring_allreduce_seconds(nbytes: float, n: int, bytes_per_s: float, latency_s: float) -> float:
    """Ring all-reduce of nbytes over n ranks: 2 (n-1)/n nbytes at the bus bandwidth."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bytes_per_s + 2 * (n - 1) * latency_s


def ring_allgather_seconds(nbytes: float, n: int, bytes_per_s: float, latency_s: float) -> float:
    """All-gather of an nbytes result over n ranks: (n-1)/n nbytes."""
    if n <= 1 or nbytes <= 0:
        return 0.0
    return (n - 1) / n * nbytes / bytes_per_s + (n - 1) * latency_s


def group_link(gpu: GpuKind, stride: int, size: int, gpus_per_host: int) -> tuple[float, float]:
    """(bus bandwidth, latency) of a collective over `size` ranks `stride` devices apart:
    NVLink when they share a host, else the InfiniBand NICs of the group's ranks on one host
    (at most NVLink's)."""
    if size <= 1 or stride * size <= gpus_per_host:
        return gpu.nvlink_bytes_per_s, gpu.nvlink_latency_s
    per_host = max(1, gpus_per_host // stride)
    return min(gpu.nvlink_bytes_per_s, per_host * gpu.ib_bytes_per_s), gpu.ib_latency_s


# ----------------------------------------------------------------------------- per-op costs

def _memory_seconds(nbytes: float, gpu: GpuKind) -> float:
    return nbytes / gpu.memory_bound_bytes_per_s


def uses_xla_attention(cfg, gpu: GpuKind) -> bool:
    """ptdp_jax runs XLA's attention (not cuDNN's) only on (d > 1, 1, t > 1) meshes whose layers
    run in a scan (tuning.scan_layers, on by default for zero=3; models/layers.causal_attention).
    Other layouts run cuDNN's ((2,1,2) micro 8: 0.1798 s on 4x H200, 2026-11-26, where XLA's
    attention would take 0.46 s)."""
    par = cfg.parallel
    return (bool(gpu.xla_attention_flops) and par.pipe == 1 and par.tensor > 1 and par.data > 1
            and cfg.scan_layers_on)


def tiled_attention(cfg, gpu: GpuKind) -> bool:
    """Whether the layers' attention is parallel/flash.py's tiled kernel on a GPU with flash
    attention (models/layers.causal_attention): where cuDNN does not run (float32,
    tuning.attention=xla) under document masking or split over context, and under document
    masking where cuDNN has no packed layout."""
    no_cudnn = cfg.tuning.attention == "xla" or cfg.compute_dtype == "float32"
    masked = cfg.data.document_mask
    return (masked and not gpu.packed_attention) or ((masked or cfg.parallel.context > 1)
                                                    and no_cudnn)


def attention_seconds(cfg, gpu: GpuKind, documents=None) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's attention core on one tensor rank (and one
    context rank: 1/c of the causal work). documents: the data's (plan/documents.py
    `Documents`) where document masking is on, else None."""
    m, t, c = cfg.model, cfg.parallel.tensor, cfg.parallel.context
    b, s, h = cfg.train.micro_batch_size, m.seq_len, m.hidden_size
    tiled = tiled_attention(cfg, gpu)
    if cfg.data.document_mask and documents is not None and not tiled \
            and gpu.attention == "flash":
        return packed_attention_seconds(cfg, gpu, documents)
    if (c > 1 or tiled or cfg.data.document_mask) and gpu.attention == "flash":
        causal = 2.0 * b * s * s * h / t / c
        slower = TILED_SLOWDOWN if tiled else CONTEXT_PARTS_SLOWDOWN if c > 1 else 1.0
        fwd, bwd = (f / slower for f in gpu.flash_fractions(s))
        return causal / (fwd * gpu.peak_flops), 2.5 * causal / (bwd * gpu.peak_flops)
    if uses_xla_attention(cfg, gpu):
        square = 4.0 * b * s * s * h / t
        return square / gpu.xla_attention_flops, 2.5 * square / gpu.xla_attention_flops
    if gpu.attention == "flash":
        causal = 2.0 * b * s * s * h / t
        fwd, bwd = gpu.flash_fractions(s)
        return causal / (fwd * gpu.peak_flops), 2.5 * causal / (bwd * gpu.peak_flops)
    square = 4.0 * b * s * s * h / t                       # Q K^T and A V, the full square
    scores = b * (m.num_heads / t) * s * s
    fwd = gpu.gemm_seconds(square) + _memory_seconds(scores * gpu.softmax_bytes_fwd, gpu)
    bwd = 2 * gpu.gemm_seconds(square) + _memory_seconds(scores * gpu.softmax_bytes_bwd, gpu)
    return fwd, bwd


def packed_attention_seconds(cfg, gpu: GpuKind, documents) -> tuple[float, float]:
    """(forward, backward) seconds of one layer's document-masked attention in cuDNN's packed
    layout: the documents' share of the causal pairs and the calls' passes."""
    m, t, c = cfg.model, cfg.parallel.tensor, cfg.parallel.context
    b, s = cfg.train.micro_batch_size, m.seq_len
    pairs = documents.share(b, c) * 2.0 * b * s * s * m.hidden_size / t / c
    slower = CONTEXT_PARTS_SLOWDOWN if c > 1 else 1.0
    fwd, bwd = (f / slower for f in gpu.flash_fractions(min(documents.length(), s)))
    kv = getattr(m, "kv_heads", None) or m.num_heads
    heads = b * s / c * (m.num_heads + 2 * kv) * m.head_dim / t * 4
    calls = documents.calls(b, c) * heads / gpu.memory_bound_bytes_per_s
    return (pairs / (fwd * gpu.peak_flops) + PACKED_CALL_PASSES[0] * calls,
            2.5 * pairs / (bwd * gpu.peak_flops) + PACKED_CALL_PASSES[1] * calls)


def op_costs(cfg, gpu: GpuKind, gpus_per_host: int, documents=None) -> OpCosts:
    """Seconds per microbatch of each op of cfg's layout on `gpu` (documents: see
    attention_seconds)."""
    m, par, tr = cfg.model, cfg.parallel, cfg.train
    t, p = par.tensor, par.pipe
    h = m.hidden_size
    T = device_tokens(cfg)
    act = gpu.activation_bytes

    gemm_fwd = sum(gpu.gemm_seconds(2.0 * M * K * N) for M, K, N in layer_gemms(cfg))
    quant_fwd = quant_bwd = 0.0
    if tr.fp8:
        gemm_fwd /= FP8_GEMM_SPEEDUP
        quant_fwd = _memory_seconds(FP8_QUANT_BYTES * sum(M * K for M, K, N
                                                          in layer_gemms(cfg)), gpu)
        quant_bwd = _memory_seconds(FP8_QUANT_BYTES * sum(M * N for M, K, N
                                                          in layer_gemms(cfg)), gpu)
    attn_fwd, attn_bwd = attention_seconds(cfg, gpu, documents)
    split = REPLICATED_SHARE + (1 - REPLICATED_SHARE) / t
    elem_fwd = _memory_seconds(gpu.elementwise_bytes_fwd * T * h * split, gpu)
    elem_bwd = _memory_seconds(gpu.elementwise_bytes_bwd * T * h * split, gpu)
    # the pipelined executor with an indexed stash (tuning.static_stash off) copies residuals
    # into and out of their slots; a static stash writes them in place (what is left of the
    # passes: static_stash_copy_share); without pipelining the producers write them in place
    # the MLP activation's output kept by selective (tuning.keep_ffn_activation) is written by its
    # own fusion, in place: no copy passes (-1.8 to -2.7% a step, 2x H200, 2026-11-27)
    bare = replace(cfg, tuning=replace(cfg.tuning, keep_ffn_activation=False))
    stash = layer_activation_bytes_per_token(bare) * T if p > 1 else 0.0
    stash *= gpu.static_stash_copy_share if cfg.static_stash_on else 1.0
    copy_fwd = _memory_seconds(gpu.stash_copy_passes_fwd * stash, gpu)
    copy_bwd = _memory_seconds(gpu.stash_copy_passes_bwd * stash, gpu)
    bw, lat = group_link(gpu, 1, t, gpus_per_host)
    tp_ar = ring_allreduce_seconds(T * h * act, t, bw, lat)
    tp_ar += gpu.tp_collective_overhead_s if t > 1 else 0.0
    tp_ar *= tp_ring_share(t) if cfg.tp_comm_overlap_on and cfg.num_microbatches == 1 else 1.0

    kv_fwd, kv_bwd = context_seconds(cfg, gpu, gpus_per_host)
    fwd = gemm_fwd + attn_fwd + elem_fwd + 2 * tp_ar + quant_fwd + kv_fwd
    bwd = 2 * gemm_fwd + attn_bwd + elem_bwd + 2 * tp_ar + quant_bwd + kv_bwd
    if cfg.recompute in ("selective", "offload"):   # flash attention's outputs kept, not rerun
        bwd += (0.0 if flash_attention_bytes_per_token(cfg) else attn_fwd) + elem_fwd + quant_fwd
        if cfg.remat.endswith("+act"):     # ... and the activation's output: T f read, written
            bwd -= min(elem_fwd, _memory_seconds(2 * 2 * T * m.ffn / t, gpu))
    if cfg.recompute == "offload":       # to the host and back: the share the GEMMs do not hide
        exposed = OFFLOAD_EXPOSED_PIPELINED if p > 1 else OFFLOAD_EXPOSED
        moved = exposed * offloaded_bytes(cfg) / HOST_LINK_BYTES_PER_S
        fwd, bwd = fwd + moved, bwd + moved
    elif cfg.recompute == "full":
        bwd += fwd
    fwd += copy_fwd
    bwd += copy_bwd
    if p > 1:   # each microbatch's weight gradients added into the float32 sums by the GEMM
        bwd += gpu.wgrad_accumulate_exposed * _memory_seconds(      # (beta 1): read + write
            8.0 * sum(K * N for _, K, N in layer_gemms(cfg)), gpu)

    V = m.padded_vocab_size
    head_gemm = gpu.gemm_seconds(2.0 * T * h * V / t)
    ce = _memory_seconds(T * V / t * 4 * gpu.head_ce_passes / 2, gpu)
    head_fwd, head_bwd = head_gemm + ce, 2 * head_gemm + ce
    embed_bwd = _memory_seconds(T * h * 4 * 3, gpu)

    message = T * h * act
    send = 0.0
    if p > 1:
        crosses = stage_boundary_crosses_host(cfg, gpus_per_host)
        link = gpu.ib_bytes_per_s if crosses else gpu.nvlink_bytes_per_s
        latency = gpu.ib_latency_s if crosses else gpu.nvlink_latency_s
        if par.scatter_gather and t > 1:
            send = message / t / link + latency
            send += ring_allgather_seconds(message, t, gpu.nvlink_bytes_per_s, gpu.nvlink_latency_s)
        else:
            send = message / link + latency
    return OpCosts(fwd, bwd, head_fwd, head_bwd, embed_bwd, send, tp_ar)


def context_seconds(cfg, gpu: GpuKind, gpus_per_host: int) -> tuple[float, float]:
    """(forward, backward) seconds of a layer's key/value traffic over 'context' (next to
    'tensor' on the mesh): the all-gather of the microbatch's key/value heads, and in the
    backward that gather again and the reduce-scatter of their gradients (not overlapped)."""
    c, m = cfg.parallel.context, cfg.model
    if c == 1:
        return 0.0, 0.0
    kv = (getattr(m, "kv_heads", None) or m.num_heads) * m.head_dim / cfg.parallel.tensor
    nbytes = 2 * cfg.train.micro_batch_size * m.seq_len * kv * gpu.activation_bytes
    bw, lat = group_link(gpu, cfg.parallel.tensor, c, gpus_per_host)
    gather = ring_allgather_seconds(nbytes, c, bw, lat)
    return gather, 2 * gather


def stage_boundary_crosses_host(cfg, gpus_per_host: int) -> bool:
    """True when some pair of neighbouring pipeline stages sits on different hosts: a stage is
    t x d consecutive devices (tensor fastest, then data, then pipe)."""
    par = cfg.parallel
    stride = par.tensor * par.data
    return par.pipe > 1 and stride * par.pipe > gpus_per_host


# ----------------------------------------------------------------------------- per step

def _reduce_bytes(cfg, gpu: GpuKind) -> int:
    """Bytes per gradient element in the data-parallel reduction (parallel.grad_reduce_dtype)."""
    return 2 if cfg.parallel.grad_reduce_dtype == "bfloat16" else gpu.grad_bytes


def dp_allreduce_seconds(cfg, gpu: GpuKind, gpus_per_host: int) -> float:
    """The data-parallel communication of one step, none of it hidden (ptdp_jax, measured):
    zero 0: one all-reduce of the device's gradients; zero 1, and zero 3 with pipelining
    (the stage's weights gathered once a step): an all-gather of the weights in the compute
    dtype and a reduce-scatter of the gradients; zero 2 without pipelining: the gather once
    and a reduce-scatter per microbatch; zero 3 without pipelining: per microbatch the
    weights gathered for the forward and again for the backward and the gradients
    reduce-scattered (7.5B (4,1,1) zero 3 micro 1: 2.49-2.67 s on 4x H200, 2026-11-26, 2.24-2.27 s
    by this model). Unrolled layers without recomputation keep their gathered weights for the
    backward, yet ran only 3% faster than with selective: counted as two gathers too."""
    from ptdp_jax.training.state import zero_stage
    par = cfg.parallel
    n = sum(params_per_device(cfg).values())
    zero = zero_stage(cfg)
    if zero:    # ZeRO's gathers and reduce-scatters run over data x context together
        ranks = par.data * par.context
        bw, lat = group_link(gpu, par.tensor, ranks, gpus_per_host)
        return _data_seconds(cfg, gpu, n, zero, bw, lat, ranks)
    # context parallelism: each gradient summed over the context ranks too
    bw, lat = group_link(gpu, par.tensor, par.data, gpus_per_host)
    cbw, clat = group_link(gpu, par.tensor, par.context, gpus_per_host)
    over_context = ring_allreduce_seconds(n * _reduce_bytes(cfg, gpu), par.context, cbw, clat)
    return over_context + _data_seconds(cfg, gpu, n, zero, bw, lat, par.data)


def _data_seconds(cfg, gpu: GpuKind, n: float, zero: int, bw: float, lat: float,
                  ranks: int) -> float:
    par = cfg.parallel
    if not zero:
        return ring_allreduce_seconds(n * _reduce_bytes(cfg, gpu), ranks, bw, lat)
    compute = 4 if cfg.compute_dtype == "float32" else 2
    gather = ring_allgather_seconds(n * compute, ranks, bw, lat)
    scatter = ring_allgather_seconds(n * _reduce_bytes(cfg, gpu), ranks, bw, lat)
    if zero == 1 or par.pipe > 1:
        return gather + scatter
    if zero == 2:                                   # gathered once, reduced every microbatch
        return gather + cfg.num_microbatches * scatter
    return cfg.num_microbatches * (2 * gather + scatter)


def pipe_allreduce_seconds(cfg, gpu: GpuKind, gpus_per_host: int) -> float:
    """Embedding and head gradients reduced over the pipeline stages (ptdp_jax: over every
    stage, which all hold them; Megatron: the tied embedding, first and last stage)."""
    par = cfg.parallel
    if par.pipe == 1:
        return 0.0
    per = params_per_device(cfg)
    n = per["embed"] + per["head"]
    ranks = par.pipe if gpu.execution == "lockstep" else 2
    bw, lat = group_link(gpu, par.tensor * par.data, ranks, gpus_per_host)
    return ring_allreduce_seconds(n * gpu.grad_bytes, ranks, bw, lat)


def accumulate_seconds(cfg, gpu: GpuKind) -> float:
    """Without pipelining, zero 0 and 1 add each microbatch's compute-dtype gradients into
    full-size float32 accumulators: m - 1 passes over them (read the sum and the gradient,
    write the sum; zero 2 and 3 add shard-sized sums, in the reduce-scatter's shadow: 7.5B
    (4,1,1) zero 1 m 8 took 0.14 s more than zero 2, 4x H200, 2026-11-27). The unrolled loop
    of zero 0 (and 1 with its reduction after the backward) adds the GEMM weights' float32
    gradients inside the GEMM (`step._master_grads`) at the pipeline's cost per microbatch
    (`wgrad_accumulate_exposed`); the rest (embedding, norms) takes the passes."""
    from ptdp_jax.training.state import zero_stage
    m, z = cfg.num_microbatches, zero_stage(cfg)
    if cfg.parallel.pipe > 1 or m == 1 or z > 1:
        return 0.0
    n = sum(params_per_device(cfg).values())
    compute = 4 if cfg.compute_dtype == "float32" else 2
    in_gemm = not (cfg.scan_layers_on or cfg.tp_comm_overlap_on
                   or (z == 1 and cfg.overlap_grad_reduce_on))
    dense = cfg.model.num_layers * sum(K * N for _, K, N in layer_gemms(cfg)) if in_gemm else 0
    return (m - 1) * _memory_seconds((n - dense) * (2 * 4 + compute), gpu) + \
        m * gpu.wgrad_accumulate_exposed * _memory_seconds(8.0 * dense, gpu)


def fp8_weight_seconds(cfg, gpu: GpuKind) -> float:
    """train.fp8: the device's GEMM weights rounded to FP8 and transposed once a step
    (models/fp8.prequantize; the transpose reads and writes a byte an element)."""
    if not cfg.train.fp8:
        return 0.0
    layers = cfg.model.num_layers / cfg.parallel.pipe
    return _memory_seconds((FP8_QUANT_BYTES + 2) * layers
                           * sum(K * N for _, K, N in layer_gemms(cfg)), gpu)


def optimizer_seconds(cfg, gpu: GpuKind) -> float:
    """AdamW over the state the device holds (1/d of it with parallel.zero)."""
    n = sum(params_per_device(cfg, state=True).values())
    return _memory_seconds(n * gpu.optimizer_bytes_per_param, gpu)
