# Sourced by benchmarks/record_suite.sh (SUITE=s16), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, session 16, two calls in one lease (carry .peer). Predictions: NOTES, issue 10
# "Session 15". S16_PART=a: the zero-dim change on the 7.5B zero 2 micro 8 (traced: are the
# optimizer's transposes gone?), zero 3 at m = 1 (its per-layer gathers under the layers),
# the peer's FSDP in the lease (issue 10 target 2). b: the 1.3B data-parallel rows
# (target 1) and (2,1,2) (issue 11 target 2) against the same lease's one-GPU step.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200} TRACE_STEPS=2
Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
# micro 8 needs ~106 GiB (H200); on 80 GB cards micro 2 (67.6 GiB) is the largest that fits
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
MB=8; (( ${mib:-0} < 100000 )) && MB=2
if [[ "${S16_PART:-a}" == "a" ]]; then
run 7.5b-dp4-zero2-mb$MB-bf16 $ours $Z75 train.micro_batch_size=$MB parallel.zero=2 parallel.grad_reduce_dtype=bfloat16 --trace-dir /tmp/s8 --trace-steps 2
f=$(newest_trace /tmp/s8); [[ -n "$f" ]] && python3 benchmarks/idle_gaps.py "$f" --top 12 > "$out/gaps_zero2.md" 2>&1
[[ -n "$f" ]] && cp "$f" "$out/trace_7.5b-dp4-zero2-mb$MB-bf16.json.gz"; rm -rf /tmp/s8
run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
run 7.5b-dp4-zero3-unrolled-mb$MB-bf16 $ours $Z75 train.micro_batch_size=$MB parallel.zero=3 train.scan_layers=false parallel.grad_reduce_dtype=bfloat16
run 7.5b-dp4-zero2-mb$MB $ours $Z75 train.micro_batch_size=$MB parallel.zero=2
run 7.5b-dp4-zero2-mb2 $ours $Z75 train.micro_batch_size=2 parallel.zero=2
# on 80 GB cards the pipeline is the other candidate (session 13: 1.556 s on 4x H200)
(( MB == 2 )) && run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=1f1b-phased --steps 3
# ptdp-plan's pick on 4x H100 (predicted 1.487 s): (2,2,1) 1f1b-phased zero 1, micro 1
(( MB == 2 )) && run 7.5b-dp2pp2-phased-zero1 $ours $B75 --mesh 2,2,1 train.global_batch_size=32 train.micro_batch_size=1 train.recompute=selective parallel.schedule=1f1b-phased parallel.zero=1 --steps 3
run peer-7.5b-dp4-fsdp-again $peer --dp 4 --pp 1 --tp 1 $P75
finish
fi
one_gpu
DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
run dp4-zero0-bf16 $ours $DP
run dp4-zero2-bf16 $ours $DP parallel.zero=2
run dp4-zero1-bf16 $ours $DP parallel.zero=1
run dp2tp2-sp-mb8-bf16 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16
# the pipeline traced with the device tracer only: does the 2.2x stretch of session 15's
# traced step (444 ms against 201) go? (NOTES issue 8 section 17)
run pp4-phased-sel-devtrace $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased --trace-dir /tmp/s9 --trace-steps 2 --trace-host-level 0
og=$(step_of 1gpu-none-mb8)
prof pp4-phased-sel-devtrace /tmp/s9 1,4,1 $PROF_PH ${og:+--one-gpu-step $og}
