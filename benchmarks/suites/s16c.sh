# Sourced by benchmarks/record_suite.sh (SUITE=s16c), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, session 16, lease 2: the per-layer gradient sums (NOTES issue 10 "Session 16") as
# an A/B against BASE (carried: the tree before, 4114917), then issue 8 target 2 (the peer's
# pp4 1F1B on the 1.3B) and issue 11 target 1 on H100 (7.5B tp4 SP). Carry .base and .peer.
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
Z75="$Z75 train.micro_batch_size=2 parallel.zero=2 parallel.grad_reduce_dtype=bfloat16"
DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
ONE="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none"
run base-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $base $ONE
run 1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $ONE
run base-7.5b-dp4-zero2-mb2-bf16 $base $Z75
run 7.5b-dp4-zero2-mb2-bf16 $ours $Z75
run base-dp4-zero0-bf16 $base $DP
run dp4-zero0-bf16 $ours $DP
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run pp4-phased-sel $ours $B13 --mesh 1,4,1 $PROF_PH
run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 3
