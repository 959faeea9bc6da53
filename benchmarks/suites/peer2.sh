# Sourced by benchmarks/record_suite.sh (SUITE=peer2), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs: our default 1f1b-phased (static stash) against the peer's pp2 1f1b, with the one-GPU
# baseline, (1,2,1) m 16. Carry .peer.
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
peer2="torchrun --standalone --nproc-per-node 2 ${3:-.peer}/torch_ptd.py"
one_gpu
run pp2-phased-sel $ours $B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased
run peer-pp2-1f1b $peer2 --dp 1 --pp 2 --tp 1 --schedule 1f1b $P13
