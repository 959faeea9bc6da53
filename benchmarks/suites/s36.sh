# Sourced by benchmarks/record_suite.sh (SUITE=s36, S36_PART=a|b). 4 GPUs (ask for
# nvidia-h100-x4). Prepared in session 35.
# Part a (~3 min): can a warm-up run open the way for the tensor ring inside the pipeline?
# benchmarks/branch_permute_probe.py with --idle makes the first-call meeting that hung the
# (1,2,2) step with the ring (session 35 part g); --warmup first runs a table in which the
# stages take the same branch at every tick. Each under a 60 s timeout (a hang is the answer).
# Part b: issue 10 target 1 against the one-GPU baseline of every GPU (one_gpu_each), and the
# 7.5B (1,1,4) ring (session 35's part b, never run).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
BP="python3 benchmarks/branch_permute_probe.py"
bp() {   # bp TAG ARGS...: one probe variant, its JSON line tagged into OUTDIR/record.jsonl
  run "probe-$1" timeout 60 $BP "${@:2}"
}
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
esac
# Part c (session 36): what NCCL's permutes (the only mode that is right inside per-stage
# branches, part a) cost the ring, on the 1.3B (1,1,2) SP micro 16 (one (1,2,2) stage's tensor
# group): two cases at once on GPUs 0-1 and 2-3, then swapped.
if [[ "${S36_PART:-a}" == c ]]; then
  TP2C="$ours $B13 --mesh 1,1,2 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true --steps 6"
  pair() {   # pair DEVICES TAG ARGS...
    run "$2" env CUDA_VISIBLE_DEVICES=$1 "${@:3}"
  }
  for round in 1 2; do
    if (( round == 1 )); then A=0,1 B=2,3; else A=2,3 B=0,1; fi
    pair $A tp2-noring-r$round $TP2C parallel.tp_comm_overlap=false &
    pair $B tp2-ring-nccl-r$round $TP2C parallel.tp_comm_overlap=true --permute-mode nccl &
    wait
    pair $A tp2-ring-peer-r$round $TP2C parallel.tp_comm_overlap=true --permute-mode peer &
    pair $B tp2-ring-nccl-memcpy-r$round env NCCL_P2P_USE_CUDA_MEMCPY=1 $TP2C parallel.tp_comm_overlap=true --permute-mode nccl &
    wait
  done
fi
# Part d: the session's figures for the closing notes (issue 10 target 1, issue 11 target 2).
if [[ "${S36_PART:-a}" == d ]]; then
  one_gpu_each
  run dp4-zero2 $ours $DP4A --steps 10
  run tp212-sp-mb8 $ours $TP212A --steps 8
  run tp4-sp-mb16 $ours $TP4A --steps 8
  run dp4-zero2-b $ours $DP4A --steps 10
  run pp2tp2-zb-v4-mb8 $ours $B13 --mesh 1,2,2 parallel.sequence_parallel=true parallel.schedule=zb-phased train.micro_batch_size=8 parallel.virtual_stages=4 train.recompute=selective --steps 6
fi
# Part e: the 7.5B (4,1,1) zero 2 micro 8 (issue 10 target 2's layout) with today's code, and
# the refitted planner out of its fit.
if [[ "${S36_PART:-a}" == e ]]; then
  run 7.5b-dp4-zero2-mb8-sel $ours $B75 --mesh 4,1,1 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=selective parallel.zero=2 parallel.grad_reduce_dtype=bfloat16 --steps 4
fi
# Part f: the same and the PyTorch peer's FSDP2 dp4 in one call (issue 10 target 2, same lease);
# the peer carried as .peer (a copy of ../shared/peer).
if [[ "${S36_PART:-a}" == f ]]; then
  run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
  run 7.5b-dp4-zero2-mb8-sel $ours $B75 --mesh 4,1,1 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=selective parallel.zero=2 parallel.grad_reduce_dtype=bfloat16 --steps 4
fi
# Part g: issue 11 target 1's layout (7.5B (1,1,4) SP micro 8, none) with today's code.
if [[ "${S36_PART:-a}" == g ]]; then
  run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 4
fi
