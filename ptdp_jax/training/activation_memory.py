"""What one layer keeps for its backward, per token of a microbatch on one device, and the
transients of its attention: the activation terms of the memory estimate
(ptdp_jax/training/memory.py), which the planner's costs read too. By train.recompute (16-bit
compute; for float32 compute twice that):

    selective  the 4 GEMM outputs and the layer input: 2 (3h + (3h + f)/t) bytes for GPT,
               2 (3h + (3h + 2f)/t) for LLaMA (= 20 h at t = 1, f = 4h); plus, where the
               attention is cuDNN's flash kernel, its output and softmax statistics,
               (2 h + 4 n) / t (`flash_attention_bytes_per_token`);
    none       78 (10 h + 24 h / t) / 34 bytes: Korthikanti et al.'s 34 s b h with flash
               attention (no 5 a s^2 b term), scaled to the 78 h bytes measured here at t = 1
               in the pipeline (the executor's per-layer vjp keeps float32 LayerNorm and GeLU
               intermediates that Megatron's fused kernels do not); 40 instead of 78 without
               pipelining (autodiff through the unrolled layers keeps about Korthikanti's 34);
    full       the layer input only, 2 h bytes, plus one layer's `none` residuals while that
               layer is recomputed in the backward (memory.py's `workspace`);
    offload    selective's: they go to the host's pinned memory after the forward
               (`offloaded_bytes`). Without pipelining XLA brings them all back before the
               backward, so the device's peak is selective's (docs/performance.md); with it
               the stash slots keep the layer inputs (full's) on the device and the rest in
               host buffers (memory.py's `host_stash_bytes`, pipeline/host_stash.py), with
               `TRANSIT_CHUNKS` chunks' worth on their way.

With parallel.sequence_parallel (t > 1) the terms not yet divided by t are divided by t
too (Korthikanti et al.'s 34 s b h / t): the (b, s, h) residuals each tensor rank kept whole
(layer input, norms, dropout) are split by sequence, as in the compiled step
(tests/test_sequence_parallel.py). Exception, on GPU: without pipelining and without
recomputation XLA keeps the two gathered GEMM inputs (the norms' outputs, 2 x 2 h bytes)
whole for the weight gradients, so 4 h (1 - 1/t) bytes are added back
(`SP_GATHERED_BYTES_PER_H`), except where the tensor ring (`tuning.tp_comm_overlap`)
gathers them again in the backward (its blocks are not kept).
No jax at module level.
"""
from __future__ import annotations

NONE_BYTES_PER_H_AT_T1 = 78.0       # recompute=none residuals per token per layer, in units of h
                                    # bytes (16-bit compute, t = 1), fitted to 1.3B (1,4,1) none
NONE_BYTES_PER_H_NO_PIPE = 40.0     # the same without pipelining (autodiff through the layers),
                                    # fitted to 1.3B (1,1,1) none micro 8 (53.43 GiB)
SP_GATHERED_BYTES_PER_H = 4.0       # sequence parallelism, p = 1, recompute=none: the two
                                    # gathered GEMM inputs XLA keeps whole (16-bit), fitted to
                                    # 1.3B and 7.5B (1,1,4) on 4x H200, 2026-11-26
TRANSIT_CHUNKS = 2      # offload with pipelining: the last forward's and the next backward's


def device_tokens(cfg) -> float:
    """A microbatch's tokens on one device: train.micro_batch_size x model.seq_len, of which a
    device holds 1 / parallel.context under context parallelism."""
    return cfg.train.micro_batch_size * cfg.model.seq_len / cfg.parallel.context


def context_attention_bytes(cfg) -> float:
    """Context parallelism's attention while one layer runs it: every rank's keys and values
    of the microbatch gathered (the compute dtype) and, in the backward, their float32
    gradients before the reduce-scatter (parallel/context.py); 0 without it."""
    c, m = cfg.parallel.context, cfg.model
    if c == 1:
        return 0.0
    kv = (getattr(m, "kv_heads", None) or m.num_heads) * m.head_dim / cfg.parallel.tensor
    tokens = cfg.train.micro_batch_size * m.seq_len
    dtype_bytes = 4 if cfg.compute_dtype == "float32" else 2
    return 2 * tokens * kv * (dtype_bytes + 4)


def document_attention_bytes(cfg) -> float:
    """Document masking in cuDNN's packed layout (parallel/packed.py) while one layer's
    backward runs it: the float32 gradients of the queries and (all of the sequence's, under
    context parallelism) keys and values that its loop over calls carries. Over the unmasked
    step of LLaMA-3-8B's layers (1x H200, 2026-12-03): 2.4 and about 2 GiB at 32k and 128k
    measured, 0.75 and 3.0 by this. 0 without it."""
    m = cfg.model
    if not cfg.data.document_mask or cfg.compute_dtype == "float32" \
            or cfg.tuning.attention == "xla":
        return 0.0
    t = cfg.parallel.tensor
    kv = (getattr(m, "kv_heads", None) or m.num_heads) * m.head_dim / t
    q = m.num_heads * m.head_dim / t
    tokens, whole = device_tokens(cfg), cfg.train.micro_batch_size * m.seq_len
    return 4 * (tokens * q + 2 * whole * kv)


def layer_activation_bytes_per_token(cfg, recompute: str | None = None) -> float:
    """Residuals one layer keeps for its backward, bytes per token of a microbatch (one device)."""
    m, t = cfg.model, cfg.parallel.tensor
    h, f = m.hidden_size, m.ffn
    mode = recompute or cfg.recompute
    scale = (4 if cfg.compute_dtype == "float32" else 2) / 2      # 16-bit is the unit
    sp = t if sequence_parallel(cfg) else 1                   # divides the replicated part
    if mode == "full":
        return 2.0 * h / sp * scale
    if mode in ("selective", "offload"):
        kv = getattr(m, "kv_heads", None) or m.num_heads     # grouped-query K and V
        qkv = h + 2 * h * kv // m.num_heads
        sharded = qkv + (2 * f if m.arch == "llama" else f)
        sharded += f if cfg.keeps_ffn_activation else 0      # the activation's output
        return 2.0 * (3 * h / sp + sharded / t) * scale + flash_attention_bytes_per_token(cfg)
    if mode == "none":
        per_h = NONE_BYTES_PER_H_AT_T1 if cfg.parallel.pipe > 1 else NONE_BYTES_PER_H_NO_PIPE
        gathered = SP_GATHERED_BYTES_PER_H * h * (1 - 1 / t) \
            if sp > 1 and cfg.parallel.pipe == 1 and not cfg.tp_comm_overlap_on else 0.0
        return (per_h * (10 * h / sp + 24 * h / t) / 34 + gathered) * scale
    raise ValueError(f"train.recompute={mode!r} is not one of "
                     f"['none', 'selective', 'offload', 'full']")


def offloaded_bytes(cfg) -> float:
    """train.recompute=offload: what one layer moves to host memory and back, per microbatch
    (one device): selective's residuals but the layer input."""
    moved = (layer_activation_bytes_per_token(cfg, "selective")
             - layer_activation_bytes_per_token(cfg, "full"))
    return moved * device_tokens(cfg)


def activation_recompute_bytes(cfg) -> float:
    """Selective recomputation without the MLP activation kept: the SwiGLU a LLaMA layer's
    backward runs again, (T, f / t) in float32, while it runs (LLaMA-3-8B's layers at 128K on
    1x H200, 2026-12-02: 6.0 GiB over the estimate without it; GPT's GeLU showed none, the
    1.3B's rows at 2K are over already); 0 otherwise."""
    if cfg.recompute not in ("selective", "offload") or cfg.keeps_ffn_activation \
            or cfg.model.arch != "llama":
        return 0.0
    return 4.0 * device_tokens(cfg) * cfg.model.ffn / cfg.parallel.tensor


def flash_attention_bytes_per_token(cfg) -> float:
    """What selective recomputation keeps of a fused (cuDNN flash) attention, per token and
    layer: its output (h / t values in the compute dtype) and softmax statistics (n / t
    float32), `models.model.FLASH_ATTENTION_FWD`, also where it runs in the per-device region
    (t > 1 with pipelining or data parallelism: `layers.keeps_residuals`). 0 where the
    attention is XLA's (float32, tuning.attention=xla)."""
    m, par = cfg.model, cfg.parallel
    if cfg.tuning.attention == "xla" or cfg.compute_dtype == "float32":
        return 0.0
    return (2.0 * m.hidden_size + 4.0 * m.num_heads) / par.tensor


def sequence_parallel(cfg) -> bool:
    from ptdp_jax.parallel.sharding import sequence_parallel_on
    return sequence_parallel_on(cfg.parallel)
