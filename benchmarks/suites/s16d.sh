# Sourced by benchmarks/record_suite.sh (SUITE=s16d), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# lease 3: the per-layer sums kept as a list (s16c's scatter-add into the stack: +25%)
export CASE_TIMEOUT=${CASE_TIMEOUT:-110}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
Z75="$Z75 train.micro_batch_size=2 parallel.zero=2 parallel.grad_reduce_dtype=bfloat16"
ONE="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none --steps 6"
run base-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $base $ONE
run 1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $ONE
run 7.5b-dp4-zero2-mb2-bf16 $ours $Z75
run base-7.5b-dp4-zero2-mb2-bf16 $base $Z75
