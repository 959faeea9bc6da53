# Sourced by benchmarks/record_suite.sh (SUITE=four), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# One lease for issues 10, 11 and 8: the one-GPU baseline, data parallelism with the state
# split (zero), tensor parallelism with sequence parallelism, the pipeline, and the peer.
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
one_gpu
run dp4-zero0-none-mb4 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none
run dp4-zero1-none-mb4 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.zero=1
run 7.5b-tp4-sp-sel $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective parallel.sequence_parallel=true --steps 3
run 7.5b-tp4-sel $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective --steps 3
run 7.5b-dp4-zero3-sel $ours $B75 --mesh 4,1,1 $L75 parallel.data=4 train.recompute=selective parallel.zero=3 --steps 3
run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
run pp4-1f1b-m16-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run pp4-zbh1-m16-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-h1
run 1.3b-tp4-sp-none-mb4 $ours $B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true
