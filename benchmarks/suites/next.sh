# Sourced by benchmarks/record_suite.sh (SUITE=next), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# What session 9 could not run (its device time ended after SUITE=dp's sixth case): zb-v and
# the pipeline without recomputation against 1f1b and the peer (issues 8, 9), the stash reads
# as GEMM operands (dynamic-slice fusion), (2,1,2) with cuDNN attention as landed (issue 11),
# NCCL's Simple protocol for the large all-reduces (issue 10). Carry .peer.
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
ZBV="parallel.schedule=zb-v parallel.virtual_stages=2"
DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
one_gpu
run pp4-1f1b-sel $ours $PP
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run pp4-zbv-sel $ours $PP $ZBV --trace-dir /tmp/n1; prof pp4-zbv-sel /tmp/n1 1,4,1 train.micro_batch_size=1 $ZBV
run pp4-1f1b-none $ours $PP train.recompute=none --trace-dir /tmp/n2
prof pp4-1f1b-none /tmp/n2 1,4,1 train.micro_batch_size=1 train.recompute=none
run pp4-zbv-none $ours $PP $ZBV train.recompute=none
run pp4-1f1b-sel-dsf env XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $ours $PP
run dp2tp2-none-mb8 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none
run dp4-zero0 $ours $DP
run dp4-zero0-nccl-simple env NCCL_PROTO=Simple $ours $DP
run 7.5b-pp4-zbv-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $ZBV parallel.stage_layers=auto --steps 3
