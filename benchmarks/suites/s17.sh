# Sourced by benchmarks/record_suite.sh (SUITE=s17), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, session 17 (carry .peer). Part a: the per-layer gradient sums of session 16 on the
# p = 1 layouts that lease 3 did not run (one GPU traced: why -0.8% only; (1,1,4) SP, whose
# s16 row ran the reverted variant; the 1.3B (4,1,1)), with the peer's FSDP and the 7.5B zero 2
# traced (are the 6.3 ms adds gone?). Part b: the pipeline's GPU HLO (do the weight-gradient
# sums run as separate passes, or in a GEMM's epilogue?), and the peer's 1.3B pp4.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
MB=8; (( ${mib:-0} < 100000 )) && MB=2
Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
Z75="$Z75 train.micro_batch_size=$MB parallel.zero=2 parallel.grad_reduce_dtype=bfloat16"
if [[ "${S17_PART:-a}" == "a" ]]; then
run 1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none --trace-dir /tmp/o1 --trace-steps 2
f=$(newest_trace /tmp/o1); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $B13 --mesh 1,1,1 --trace "$f" --trace-steps 2 --top 12 train.micro_batch_size=8 train.recompute=none > "$out/prof_1gpu.md" 2>&1; rm -rf /tmp/o1
run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
run 7.5b-dp4-zero2-mb$MB-bf16 $ours $Z75 --trace-dir /tmp/o2 --trace-steps 2
f=$(newest_trace /tmp/o2); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $B75 --mesh 4,1,1 --trace "$f" --trace-steps 2 --top 12 train.global_batch_size=32 train.micro_batch_size=$MB > "$out/prof_zero2.md" 2>&1; rm -rf /tmp/o2
run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 3
run tp4-sp-mb16 $ours $B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true
run dp4-zero0-bf16 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16
run peer-7.5b-dp4-fsdp-again $peer --dp 4 --pp 1 --tp 1 $P75
finish
fi
one_gpu
run pp4-phased-sel $ours $B13 --mesh 1,4,1 $PROF_PH --hlo-dir /tmp/h3
gzip -c /tmp/h3/step_after_optimizations.txt > "$out/hlo_pp4_phased.txt.gz" 2>/dev/null
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run pp4-phased-sel-m8 $ours $B13 --mesh 1,4,1 $PROF_PH train.global_batch_size=8
run pp4-phased-sel-m32 $ours $B13 --mesh 1,4,1 $PROF_PH train.global_batch_size=32
# NCCL's protocol: every trace shows RING_LL kernels even for 100+ MB messages (LL moves half
# the bytes per NVLink transfer of Simple). Tried once, on zero 0's mostly hidden all-reduce
# (session 10: no change); not on the exposed tensor-parallel collectives or zero 2's.
T13="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
D13="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2"
run tp4-sp-mb16 $ours $T13
run tp4-sp-mb16-simple env NCCL_PROTO=Simple $ours $T13
run tp4-sp-mb16-ll128 env NCCL_PROTO=LL128 $ours $T13
run dp4-zero2-bf16 $ours $D13
run dp4-zero2-bf16-simple env NCCL_PROTO=Simple $ours $D13
