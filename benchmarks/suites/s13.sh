# Sourced by benchmarks/record_suite.sh (SUITE=s13), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs, session 13, profile first: the one-GPU baselines (micro 8 and 4), (1,1,2) traced
# with and without sequence parallelism (issue 11: how much of the step is exposed tensor
# all-reduce), (2,1,1) zero 0 / 1 / 1 after the backward (issue 10), (1,2,1) phased (issue 8).
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
TP2="$B13 --mesh 1,1,2 train.micro_batch_size=4 train.recompute=none"
DP2="$B13 --mesh 2,1,1 train.recompute=none"
one_gpu
run 1gpu-none-mb4 env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1 train.micro_batch_size=4 train.recompute=none
run tp2-none-mb4 $ours $TP2 --trace-dir /tmp/s1 --hlo-dir /tmp/h1
prof tp2-none-mb4 /tmp/s1 1,1,2 train.micro_batch_size=4 train.recompute=none
gzip -c /tmp/h1/step_after_optimizations.txt > "$out/hlo_tp2.txt.gz" 2>/dev/null
run tp2-sp-none-mb4 $ours $TP2 parallel.sequence_parallel=true --trace-dir /tmp/s2
prof tp2-sp-none-mb4 /tmp/s2 1,1,2 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true
run dp2-zero0-mb8 $ours $DP2 train.micro_batch_size=8
run dp2-zero1-mb8 $ours $DP2 train.micro_batch_size=8 parallel.zero=1
run dp2-zero1-after-mb8 $ours $DP2 train.micro_batch_size=8 parallel.zero=1 parallel.overlap_grad_reduce=false
run dp2-zero0-mb4 $ours $DP2 train.micro_batch_size=4
run dp2-zero1-after-mb4 $ours $DP2 train.micro_batch_size=4 parallel.zero=1 parallel.overlap_grad_reduce=false
run pp2-phased-sel $ours $B13 --mesh 1,2,1 $PROF_PH
