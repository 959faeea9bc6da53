# Sourced by benchmarks/record_suite.sh (SUITE=s14d), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, the same lease: issue 11 target 2, the 1.3B with tensor parallelism at larger micro
export CASE_TIMEOUT=${CASE_TIMEOUT:-120}
T13="$B13 train.recompute=none"
run tp4-sp-mb16 $ours $T13 --mesh 1,1,4 train.micro_batch_size=16 parallel.sequence_parallel=true
run tp4-sp-mb8 $ours $T13 --mesh 1,1,4 train.micro_batch_size=8 parallel.sequence_parallel=true
run dp2tp2-sp-mb8 $ours $T13 --mesh 2,1,2 train.micro_batch_size=8 parallel.sequence_parallel=true
run pp2tp2-sp-mb2 $ours $T13 --mesh 1,2,2 train.micro_batch_size=2 parallel.sequence_parallel=true parallel.schedule=1f1b-phased
run tp4-mb16 $ours $T13 --mesh 1,1,4 train.micro_batch_size=16
