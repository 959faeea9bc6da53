# Sourced by benchmarks/record_suite.sh (SUITE=s23x2b), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs (session 23): s23x2's trace showed zero 2's per-layer all-gathers and reduce-scatters
# at ~16-20 MB each (XLA's combiners stop near their 30 MB default), 82 + 63 a step, running at
# a third to a half of the all-reduce's bandwidth. A/B in one call: XLA's all-gather and
# reduce-scatter combine thresholds raised to 128 and 512 MB (~140 s).
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
DP2="$B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2 --steps 10"
C="--xla_gpu_all_gather_combine_threshold_bytes"; R="--xla_gpu_reduce_scatter_combine_threshold_bytes"
run dp2-zero2-bf16-mb8 $ours $DP2
run dp2-zero2-bf16-mb8-comb128 env XLA_FLAGS="$C=134217728 $R=134217728" $ours $DP2
run dp2-zero2-bf16-mb8-comb512 env XLA_FLAGS="$C=536870912 $R=536870912" $ours $DP2
run dp2-zero2-bf16-mb8-again $ours $DP2
