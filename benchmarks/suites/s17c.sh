# Sourced by benchmarks/record_suite.sh (SUITE=s17c), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, session 17, lease 2 (carry .peer and .base = 6f0cf44). Part a: 1f1b-phased as
# warm-up / steady pairs / cool-down loops against .base (the same call, A B A B, the repeats
# from JAX's compilation cache), the pipeline without recomputation, and NCCL's protocol
# (what s17 b's deadline skipped). Part b: the 7.5B pp4 against the peer's on this card.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
PP="$B13 --mesh 1,4,1 $PROF_PH"
if [[ "${S17C_PART:-a}" == "a" ]]; then
one_gpu
run base-pp4-phased-sel $base $PP
run pp4-phased-sel $ours $PP
run base-pp4-phased-sel-again $base $PP
run pp4-phased-sel-again $ours $PP
run pp4-phased-none $ours $PP train.recompute=none
T13="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
D13="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2"
run tp4-sp-mb16 $ours $T13
run tp4-sp-mb16-simple env NCCL_PROTO=Simple $ours $T13
run dp4-zero2-bf16 $ours $D13                       # last: the deadline may skip these two
run dp4-zero2-bf16-simple env NCCL_PROTO=Simple $ours $D13
finish
fi
run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=1f1b-phased --steps 3
run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
run base-7.5b-pp4-phased-sel $base $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=1f1b-phased --steps 3
