"""Memory per device of the train state, by parallel.zero: the float32 master weights, the
weights in the compute dtype, the float32 gradient accumulators and AdamW's moments
(`ptdp_jax.training.memory.estimate_memory` adds the activations and the workspace; the parameters
one device holds are `memory.params_per_device`'s).

* params: float32 master weights (4 B/param) and, with train.dtype=bfloat16, the bf16 compute
  copies made once per step (2 B/param);
* grads: float32 accumulators (4 B/param); optimizer: AdamW's m and v in float32 (8 B/param),
  and with delayed FP8 scaling the amax history (2 x train.fp8_amax_history float32 values a
  GEMM weight of a layer: kilobytes).
* parallel.zero (d > 1) splits the state over 'data' (each tensor by d along its ZeRO dim,
  `sharding.zero_axes`; a tensor with none stays whole): zero=1 holds 1/d of the master weights
  and AdamW moments plus the weights gathered for the step in the compute dtype (full size)
  and full float32 gradient accumulators (twice without pipelining when m > 1: the
  microbatch loop's carry, `ACC_CARRY_COPIES`); zero=2 (p = 1) the same but its gradient sums
  split, twice, plus two layers' full-size float32 gradients before their reduce-scatters
  (fitted: 4-7% under the 7.5B's measured peaks, 4x H200, 2026-11-27); zero=3 without
  pipelining also holds the gradients
  split, and of the gathered weights only the embedding, head and two layers (the one in use
  and the next; four with unrolled layers, whose gathers XLA starts early) in the compute
  dtype, plus their float32 gradients before the reduce-scatter, but every layer's gathered
  weight when the layers are unrolled without recomputation (autodiff keeps them for the
  backward); zero=3's scanned layers hold their residuals twice (`memory.SCAN_RESIDUAL_COPIES`).
  With p > 1 every zero value gathers a stage's weights once per step and upcasts them to
  float32 for the executor (4 B/param of the stage, full size).

No jax at module level, as in ptdp_jax.training.memory.
"""
from __future__ import annotations

MASTER_BYTES_PER_PARAM = 4          # float32 master weights
COMPUTE_COPY_BYTES_PER_PARAM = 2    # bf16 copies of the weights (train.dtype=bfloat16 only)
GRAD_BYTES_PER_PARAM = 4            # float32 gradient accumulators
ADAM_BYTES_PER_PARAM = 8            # AdamW m and v, float32
ACC_CARRY_COPIES = 2                # zero=1 (p = 1, m > 1) and zero=2: the float32 gradient
                                    # sums twice (state_bytes)


def state_bytes(cfg, used: dict[str, float], held: float) -> tuple[float, float, float]:
    """(params, grads, optimizer) bytes per device, by parallel.zero (see the module doc).
    used: the parameters of one device by group, as the model uses them (no ZeRO split,
    `memory.params_per_device(cfg)`); held: how many of them its train state holds
    (`params_per_device(cfg, state=True)`, summed; read only where parallel.zero >= 1)."""
    params, grads, opt = _weight_state_bytes(cfg, used, held)
    return params, grads, opt + fp8_history_bytes(cfg)


def fp8_history_bytes(cfg) -> float:
    """Bytes per device of delayed FP8 scaling's amax history (training/fp8_state.py)."""
    from ptdp_jax.training.fp8_state import delayed, meta_names
    if not delayed(cfg):
        return 0.0
    from ptdp_jax.pipeline.balance import chunk_layers
    layers = cfg.parallel.virtual_stages * max(chunk_layers(cfg))
    return layers * len(meta_names(cfg)) * 2 * cfg.train.fp8_amax_history * 4.0


def _weight_state_bytes(cfg, used: dict[str, float], held: float):
    """state_bytes without the FP8 history."""
    from ptdp_jax.training.state import zero_stage
    n = sum(used.values())
    copies = COMPUTE_COPY_BYTES_PER_PARAM if cfg.compute_dtype == "bfloat16" else 0
    zero = zero_stage(cfg)
    if not zero:
        return n * (MASTER_BYTES_PER_PARAM + copies), n * GRAD_BYTES_PER_PARAM, \
            n * ADAM_BYTES_PER_PARAM
    compute = 2 if cfg.compute_dtype == "bfloat16" else 4      # bytes of a gathered weight
    master, adam = held * MASTER_BYTES_PER_PARAM, held * ADAM_BYTES_PER_PARAM
    if cfg.parallel.pipe > 1:
        # the stage's weights gathered once per step and upcast to float32 for the executor
        # (zero.gather_stage; fitted: 7.5B (2,2,1) 1f1b-phased zero 1, 59.97 GiB on 4x H100,
        # 2026-11-27, against 53.09 when counted in the compute dtype)
        return master + n * MASTER_BYTES_PER_PARAM, n * GRAD_BYTES_PER_PARAM, adam
    if zero == 1:
        # zero=1 without pipelining and m > 1: the full-size float32 accumulators are the
        # microbatch loop's carry, in and out both live (fitted: 7.5B (4,1,1) micro 1 and 2,
        # 102.3 and 113.0 GiB on 4x H200, 2026-11-27); at m = 1 once (1.3B (2,1,1) micro 8
        # none: 42.89 GiB, as zero=2's 43.31, 2x H200, 2026-11-27)
        acc = ACC_CARRY_COPIES if cfg.num_microbatches > 1 else 1
        return master + n * compute, acc * n * GRAD_BYTES_PER_PARAM, adam
    par = cfg.parallel
    from ptdp_jax.pipeline.balance import chunk_layers
    layer = used["layers"] / (par.virtual_stages * max(chunk_layers(cfg)))
    if zero == 2:
        # whole weights for the step; shard-sized gradient sums, plus two layers' full-size
        # float32 gradients waiting for their reduce-scatters
        # (embedding and head too: the tied embedding's gradient is whole only at the end)
        # (the sums twice, as zero=1's, even at m = 1: fitted to the 7.5B (4,1,1) at micro 1-8,
        # 61.5-106.4 GiB on 4x H200, 2026-11-27)
        pending = min(used["embed"] + used["head"] + 2 * layer, n)
        sums = ACC_CARRY_COPIES * held + pending
        return master + n * compute, sums * GRAD_BYTES_PER_PARAM, adam
    # gathered at once: the layer in use and the next, or with unrolled layers (XLA schedules
    # their gathers early, fitted: 7.5B selective, 41.6 GiB on 4x H200, 2026-11-26) four
    live = min(used["embed"] + used["head"] + (2 if cfg.scan_layers_on else 4) * layer, n)
    gathered = live
    if cfg.recompute == "none" and not cfg.scan_layers_on:
        # unrolled layers without recomputation: autodiff keeps every layer's gathered weight
        # for its backward (the input gradient's GEMM reads it), so all of them live at once
        gathered = n
    return master + gathered * compute, (held + live) * GRAD_BYTES_PER_PARAM, adam
