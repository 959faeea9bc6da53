# Sourced by benchmarks/record_suite.sh (SUITE=s22m2), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs, session 22: the p = 1 sums inside the GEMM (NOTES issue 8 section 24) on layouts
# with 'tensor' or 'data' and m > 1, A/B against BASE (the commit before it, carried as .base).
export CASE_TIMEOUT=${CASE_TIMEOUT:-120}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
TP2="$B13 --mesh 1,1,2 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true --steps 6"
DP2="$B13 --mesh 2,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 --steps 6"
run new-tp2-sp-mb4 $ours $TP2
run base-tp2-sp-mb4 $base $TP2
run new-dp2-bf16-mb4 $ours $DP2
run base-dp2-bf16-mb4 $base $DP2
