# Sourced by benchmarks/record_suite.sh (SUITE=s14c), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, the same lease as s14 b: the flags and what s14's deadline skipped
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
PP="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased"
DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
T75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none --steps 3"
run pp4-phased-sel-cublas env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false $ours $PP
run 7.5b-tp4-sp-none-mb8 $ours $T75 train.micro_batch_size=8 parallel.sequence_parallel=true
run 7.5b-tp4-none-mb4 $ours $T75 train.micro_batch_size=4
run dp4-zero0-bf16 $ours $DP parallel.grad_reduce_dtype=bfloat16
run 7.5b-dp4-zero3-unrolled-none $ours $B75 --mesh 4,1,1 train.global_batch_size=32 train.micro_batch_size=1 parallel.zero=3 --steps 3 train.recompute=none train.scan_layers=false
