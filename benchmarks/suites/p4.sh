# Sourced by benchmarks/record_suite.sh (SUITE=p4), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# Issue 8's targets on 4 GPUs, priority order (run it as two calls: P4_PART=a, then b;
# c: the per-device attention's residuals, A/B against BASE on the t = 2 layouts).
# a: the one-GPU baseline, 1f1b-phased traced (per-pair breakdown, collectives by op), the
#    peer, the 7.5B phased and the peer's 7.5B pp4 (targets 1-3);
# b: interleaved v 2 (1.3B) and v 3 (7.5B), phased peak memory at m 8 and 32 (target 4),
#    1f1b (halves). Carry .peer.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
PH="parallel.schedule=1f1b-phased"
INT="parallel.schedule=interleaved"
if [[ "${P4_PART:-a}" == "a" ]]; then
  one_gpu
  run pp4-phased-sel $ours $PP $PH --trace-dir /tmp/p4
  og=$(step_of 1gpu-none-mb8)
  prof pp4-phased-sel /tmp/p4 1,4,1 train.micro_batch_size=1 $PH ${og:+--one-gpu-step $og}
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $PH --steps 3
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
elif [[ "${P4_PART}" == "c" ]]; then
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  for lay in "1,2,2 $PH train.micro_batch_size=1" "2,1,2 train.micro_batch_size=8 train.recompute=none"; do
    set -- $lay; m=$1; shift
    run "base-${m//,/}" $base $B13 --mesh $m "$@"
    run "new-${m//,/}" $ours $B13 --mesh $m "$@"
  done
else
  run pp4-int2-sel $ours $PP $INT parallel.virtual_stages=2
  run pp4-phased-sel-m8 $ours $PP $PH train.global_batch_size=8
  run pp4-phased-sel-m32 $ours $PP $PH train.global_batch_size=32
  run 7.5b-pp4-int3-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $INT parallel.virtual_stages=3 --steps 3
  run pp4-1f1b-sel $ours $PP
fi
