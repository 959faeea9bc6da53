# Sourced by benchmarks/record_suite.sh (SUITE=s18), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, session 18 (carry .peer). Part a: zb-phased against 1f1b-phased (NOTES issue 9,
# "Session 17": -3% predicted at 1.3B m 16; 1f1b-phased itself, one permute a row, -1 to
# -3 ms against s17's 0.1914 s), its trace (copies of the W stash?), and the
# pipeline without recomputation traced (why +9.5%?). Part b: the 7.5B pp4 both ways and the
# peer's pp4 (issue 9 target 2), then on H100 the 7.5B (1,1,4) SP (issue 11 target 1).
export CASE_TIMEOUT=${CASE_TIMEOUT:-220} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
PP="$B13 --mesh 1,4,1 $PROF_PH"
ZP="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased"
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
if [[ "${S18_PART:-a}" == "a" ]]; then
one_gpu
run base-pp4-phased-sel $base $PP      # .base: two permutes a row (git archive 36654a6)
run pp4-phased-sel $ours $PP
run pp4-zbphased-sel $ours $ZP
run pp4-zbphased-sel-traced $ours $ZP --trace-dir /tmp/z1 --trace-steps 2 --trace-host-level 0
f=$(newest_trace /tmp/z1); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $B13 --mesh 1,4,1 --trace "$f" --trace-steps 2 --top 25 train.micro_batch_size=1 parallel.schedule=zb-phased > "$out/prof_zbphased.md" 2>&1; rm -rf /tmp/z1
run pp4-phased-sel-again $ours $PP
run pp4-phased-none-traced $ours $PP train.recompute=none --trace-dir /tmp/n1 --trace-steps 2 --trace-host-level 0
f=$(newest_trace /tmp/n1); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $B13 --mesh 1,4,1 --trace "$f" --trace-steps 2 --top 25 $PROF_PH train.recompute=none > "$out/prof_phased_none.md" 2>&1; rm -rf /tmp/n1
finish
fi
Q75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3"
run 7.5b-pp4-zbphased-sel $ours $Q75 parallel.schedule=zb-phased
run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
run 7.5b-pp4-phased-sel $ours $Q75 parallel.schedule=1f1b-phased
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
(( ${mib:-0} < 100000 )) && run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 3
