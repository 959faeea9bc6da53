# Sourced by benchmarks/record_suite.sh (SUITE=s11), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# Issue 8, session 11, 4 GPUs: the static stash (now the default) at p = 4 with the peer and
# the 7.5B against the peer's pp4 1f1b in the same lease (target 3). Carry .peer. Priority order.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
PH="parallel.schedule=1f1b-phased"
one_gpu
run pp4-phased-sel $ours $PP $PH
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $PH --steps 3
run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
run pp4-phased-none $ours $PP $PH train.recompute=none
run pp4-1f1b-sel $ours $PP
run pp4-phased-sel-dyn $ours $PP $PH parallel.static_stash=false
