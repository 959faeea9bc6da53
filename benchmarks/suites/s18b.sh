# Sourced by benchmarks/record_suite.sh (SUITE=s18b), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs (carry .peer): 1f1b-phased interleaved (v > 1) against v = 1 (NOTES issue 8
# section 20; s18's lease 2 ran v > 1 as rounds of loops, which did not compile in time).
# Part a (~450 s): a tiny v 2 compile check, the 1.3B m 16 v 1 and v 2, the peer's 7.5B pp4
# 1F1B. Part b (~400 s): the 7.5B m 32 v 1 and v 3 ("interleaved faster than 1F1B").
# Part c (~400 s): the 7.5B zb-phased v 3, then zb-phased 1.3B traced, one tick a row.
export CASE_TIMEOUT=${CASE_TIMEOUT:-330} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
PP="$B13 --mesh 1,4,1 $PROF_PH"
Q75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3 parallel.schedule=1f1b-phased"
TINY="$B13 --mesh 1,4,1 $PROF_PH model.num_layers=8 model.hidden_size=512 model.num_heads=8 --steps 2"
tiny_ok() { [[ -n "$(step_of tiny-pp4-phased-v2)" ]]; }
if [[ "${S18B_PART:-a}" == "a" ]]; then
CASE_TIMEOUT=150 run tiny-pp4-phased-v2 $ours $TINY parallel.virtual_stages=2
run pp4-phased-sel $ours $PP
if tiny_ok; then
run pp4-phased-v2-sel $ours $PP parallel.virtual_stages=2
else   # a compile that grows (XLA's loop unrolling, the region-based copy insertion that the
       # static stash turns on) or a hang? the tiny case without each
CASE_TIMEOUT=150 run tiny-pp4-phased-v2-nounroll env XLA_FLAGS=--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_NO_UNROLL $ours $TINY parallel.virtual_stages=2
CASE_TIMEOUT=150 run tiny-pp4-phased-v2-dynstash $ours $TINY parallel.virtual_stages=2 parallel.static_stash=false
fi
one_gpu
run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
finish
fi
if [[ "${S18B_PART}" == "b" ]]; then
run 7.5b-pp4-phased-sel $ours $Q75
run 7.5b-pp4-phased-v3-sel $ours $Q75 parallel.virtual_stages=3
finish
fi
run 7.5b-pp4-zbphased-v3-sel $ours ${Q75/1f1b-phased/zb-phased} parallel.virtual_stages=3
ZP="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased"
run pp4-zbphased-sel-traced $ours $ZP --trace-dir /tmp/z1 --trace-steps 2 --trace-host-level 0
f=$(newest_trace /tmp/z1); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $ZP --trace "$f" --trace-steps 2 --top 12 --step-time "$(step_of pp4-zbphased-sel-traced)" > "$out/prof_zbphased_rows.md" 2>&1; rm -rf /tmp/z1
