# Sourced by benchmarks/record_suite.sh (SUITE=s36, S36_PART=a..g). 4 GPUs (4x H200 in
# session 36). Each part's prediction and outcome: benchmarks/NOTES.md, session 36.
# a (~3 min): can a warm-up run open the way for the tensor ring inside the pipeline?
#   benchmarks/branch_permute_probe.py with --idle makes the first-call meeting that hung the
#   (1,2,2) step with the ring (session 35 part g); --warmup first runs a table in which the
#   stages take the same branch at every tick. Each under a 60 s timeout (a hang is the answer).
# b: (4,1,1) against the one-GPU baseline of every GPU, the 7.5B (1,1,4) ring (not run).
# c: what NCCL's permutes (the only mode right inside per-stage branches, part a) cost the
#   ring, on the 1.3B (1,1,2) SP micro 16 (one (1,2,2) stage's tensor group): two cases at once
#   on GPUs 0-1 and 2-3, then swapped.
# d: the session's figures for issue 10 target 1 and issue 11 target 2.
# e: the 7.5B (4,1,1) zero 2 micro 8 (issue 10 target 2's layout), the planner out of its fit;
# f: the same and the PyTorch peer's FSDP2 dp4 in one call (PEER_DIR .peer, a copy of
#   ../shared/peer); g: the 7.5B (1,1,4) SP micro 8 (issue 11 target 1's layout).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
BP="python3 benchmarks/branch_permute_probe.py"
bp() {   # bp TAG ARGS...: one probe variant, its JSON line tagged into OUTDIR/record.jsonl
  run "probe-$1" timeout 60 $BP "${@:2}"
}
pair() {   # pair DEVICES TAG ARGS...: a case on the GPUs DEVICES
  run "$2" env CUDA_VISIBLE_DEVICES=$1 "${@:3}"
}
TP2C="$ours $B13 --mesh 1,1,2 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true --steps 6"
DP75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=selective parallel.zero=2 parallel.grad_reduce_dtype=bfloat16 --steps 4"
case "${S36_PART:-a}" in
a) bp plain
   bp idle --idle
   bp idle-warmup --idle --warmup
   bp idle-warmup-peer --idle --warmup --peer
   bp idle-peer --idle --peer ;;
b) one_gpu_each
   run dp4-zero2 $ours $DP4A --steps 10
   run 7.5b-tp4-sp-mb8-ring $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.tp_comm_overlap=true --steps 4
   run dp4-zero2-b $ours $DP4A --steps 10 ;;
c) for round in 1 2; do
     if (( round == 1 )); then A=0,1 B=2,3; else A=2,3 B=0,1; fi
     pair $A tp2-noring-r$round $TP2C parallel.tp_comm_overlap=false &
     pair $B tp2-ring-nccl-r$round $TP2C parallel.tp_comm_overlap=true --permute-mode nccl &
     wait
     pair $A tp2-ring-peer-r$round $TP2C parallel.tp_comm_overlap=true --permute-mode peer &
     pair $B tp2-ring-nccl-memcpy-r$round env NCCL_P2P_USE_CUDA_MEMCPY=1 $TP2C parallel.tp_comm_overlap=true --permute-mode nccl &
     wait
   done ;;
d) one_gpu_each
   run dp4-zero2 $ours $DP4A --steps 10
   run tp212-sp-mb8 $ours $TP212A --steps 8
   run tp4-sp-mb16 $ours $TP4A --steps 8
   run dp4-zero2-b $ours $DP4A --steps 10
   run pp2tp2-zb-v4-mb8 $ours $B13 --mesh 1,2,2 parallel.sequence_parallel=true parallel.schedule=zb-phased train.micro_batch_size=8 parallel.virtual_stages=4 train.recompute=selective --steps 6 ;;
e) run 7.5b-dp4-zero2-mb8-sel $ours $DP75 ;;
f) run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
   run 7.5b-dp4-zero2-mb8-sel $ours $DP75 ;;
g) run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 4 ;;
esac
