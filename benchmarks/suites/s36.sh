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
