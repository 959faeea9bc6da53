# Sourced by benchmarks/record_suite.sh (SUITE=phased), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# Issue 8, session 10: 1F1B in forward and backward phases (every op of a tick of one kind)
# against the halves-1F1B and the peer; the 7.5B both ways; memory at m 32; (1,2,2) for
# issue 11. Carry .peer. Ordered by priority for a short lease.
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
PH="parallel.schedule=1f1b-phased"
one_gpu
run pp4-1f1b-sel $ours $PP
run pp4-phased-sel $ours $PP $PH
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $PH --steps 3
run 7.5b-pp4-1f1b-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3
run pp4-phased-none $ours $PP $PH train.recompute=none
run pp4-phased-sel-m32 $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 train.global_batch_size=32 $PH
run pp2tp2-phased-sel $ours $B13 --mesh 1,2,2 train.micro_batch_size=1 $PH
run pp4-phased-sel-m8 $ours $B13 --mesh 1,4,1 train.micro_batch_size=2 $PH
