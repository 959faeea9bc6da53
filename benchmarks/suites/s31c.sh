# Sourced by benchmarks/record_suite.sh (SUITE=s31c). 4 GPUs, ~450 s. Session 31, issue 11: the
# landed default (parallel.tp_comm_overlap=auto: the ring with XLA's peer-mode permutes, set by
# step.compiler_options, where m = 1) with no XLA_FLAGS; the 7.5B (1,1,4) SP micro 8 (m 4, not
# in auto) with the ring forced on against off; (2,1,2) under auto against (4,1,1) zero 2.
export CASE_TIMEOUT=${CASE_TIMEOUT:-220}
TP4=$TP4_MB16
run tp4-sp-mb16-auto $TP4
T75="$ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 5"
run 7.5b-tp4-sp-mb8-ring $T75 parallel.tp_comm_overlap=true
run 7.5b-tp4-sp-mb8 $T75 parallel.tp_comm_overlap=false
run tp212-sp-mb8-auto $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16 --steps 8
run dp4-zero2 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2 --steps 10
one_gpu
