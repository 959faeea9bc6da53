# Sourced by benchmarks/record_suite.sh (SUITE=s15), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, session 15, three calls in one lease with the same OUTDIR (b reads a's one-GPU
# step from record.jsonl); carry .peer. Predictions: NOTES, issue 10 "Session 14, after the
# lease" and issue 11 "Session 14". S15_PART=a: the one-GPU step, the 7.5B data-parallel
# layouts (zero 1, 2, 3) and the peer's FSDP (issue 10 target 2). b: the pipeline traced
# with a pause between its two traced steps (issue 8), tp_comm_overlap at micro 16 / 8
# (issue 11). c: bf16 reductions and the (1,1,2) overlap A/B, traced.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200} TRACE_STEPS=2
Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
if [[ "${S15_PART:-a}" == "a" ]]; then
one_gpu
run 7.5b-dp4-zero1-sel-mb1 $ours $Z75 train.micro_batch_size=1 parallel.zero=1
run 7.5b-dp4-zero2-sel-mb2 $ours $Z75 train.micro_batch_size=2 parallel.zero=2
run 7.5b-dp4-zero2-sel-mb2-bf16 $ours $Z75 train.micro_batch_size=2 parallel.zero=2 parallel.grad_reduce_dtype=bfloat16
run 7.5b-dp4-zero2-sel-mb1 $ours $Z75 train.micro_batch_size=1 parallel.zero=2
run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
run 7.5b-dp4-zero3-unrolled-sel-mb2 $ours $Z75 train.micro_batch_size=2 parallel.zero=3 train.scan_layers=false
finish
fi
if [[ "${S15_PART:-a}" == "b" ]]; then
og=$(step_of 1gpu-none-mb8)
run pp4-phased-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased --trace-dir /tmp/s6 --trace-steps 2
prof pp4-phased-sel /tmp/s6 1,4,1 $PROF_PH ${og:+--one-gpu-step $og}
# tp_comm_overlap where its permutes are fewer per token (NOTES issue 11, session 14)
TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
run tp4-sp-mb16 $ours $TP4
run tp4-sp-ov-mb16 $ours $TP4 parallel.tp_comm_overlap=true
T75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true --steps 3"
run 7.5b-tp4-sp-none-mb8 $ours $T75
run 7.5b-tp4-sp-ov-none-mb8 $ours $T75 parallel.tp_comm_overlap=true
finish
fi
DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
run dp4-zero1-after-bf16 $ours $DP parallel.zero=1 parallel.overlap_grad_reduce=false parallel.grad_reduce_dtype=bfloat16
run dp2tp2-sp-mb8-bf16 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16
TP2="$B13 --mesh 1,1,2 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true"
run tp2-sp-mb4 env CUDA_VISIBLE_DEVICES=0,1 $ours $TP2
run tp2-sp-ov-mb4 env CUDA_VISIBLE_DEVICES=0,1 $ours $TP2 parallel.tp_comm_overlap=true --trace-dir /tmp/s7
prof tp2-sp-ov-mb4 /tmp/s7 1,1,2 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true parallel.tp_comm_overlap=true
