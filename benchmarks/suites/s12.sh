# Sourced by benchmarks/record_suite.sh (SUITE=s12), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs, session 12's defaults (flash attention kept, q, k, v apart, no dot merger) against
# BASE (carried: before q, k, v apart), with the one-GPU baseline both ways and the peer.
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
peer2="torchrun --standalone --nproc-per-node 2 ${3:-.peer}/torch_ptd.py"
PP2="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased"
S1="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none"
one_gpu
run base-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $base $S1
run new-pp2-phased-sel $ours $PP2
run base-pp2-phased-sel $base $PP2
run peer-pp2-1f1b $peer2 --dp 1 --pp 2 --tp 1 --schedule 1f1b $P13
run new-pp2-1f1b-sel $ours $B13 --mesh 1,2,1 train.micro_batch_size=1
