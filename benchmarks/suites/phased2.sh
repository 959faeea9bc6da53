# Sourced by benchmarks/record_suite.sh (SUITE=phased2), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# The same A/B on 2 GPUs (when no 4-GPU machine is lent): (1,2,1), m 16.
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
PP="$B13 --mesh 1,2,1 train.micro_batch_size=1"
PH="parallel.schedule=1f1b-phased"
peer2="torchrun --standalone --nproc-per-node 2 ${3:-.peer}/torch_ptd.py"
one_gpu
run pp2-1f1b-sel $ours $PP --trace-dir /tmp/p0; prof pp2-1f1b-sel /tmp/p0 1,2,1 train.micro_batch_size=1
run pp2-phased-sel $ours $PP $PH --trace-dir /tmp/p1; prof pp2-phased-sel /tmp/p1 1,2,1 train.micro_batch_size=1 $PH
run peer-pp2-1f1b $peer2 --dp 1 --pp 2 --tp 1 --schedule 1f1b $P13
run pp2-phased-none $ours $PP $PH train.recompute=none
run pp2-1f1b-none $ours $PP train.recompute=none
