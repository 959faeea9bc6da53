# Sourced by benchmarks/record_suite.sh (SUITE=qkv), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs, A/B against BASE (carried): GPT's q, k, v as three weights instead of one fused
# (h, 3, n, d); (1,2,1) 1f1b-phased traced both ways, the new one also without XLA's dot
# merger (which may fuse the three GEMMs back); the one-GPU baseline both ways.
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
PP2="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased"
S1="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none"
run base-pp2-phased-sel $base $PP2 --trace-dir /tmp/q1; prof base-pp2-phased-sel /tmp/q1 1,2,1 $PROF_PH
run new-pp2-phased-sel $ours $PP2 --trace-dir /tmp/q2 --hlo-dir /tmp/h2; prof new-pp2-phased-sel /tmp/q2 1,2,1 $PROF_PH
gzip -c /tmp/h2/step_after_optimizations.txt > "$out/hlo_pp2_phased.txt.gz" 2>/dev/null
run new-pp2-phased-sel-nomerge env XLA_FLAGS=--xla_gpu_dot_merger_threshold_mb=0 $ours $PP2
run base-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $base $S1
run new-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $S1
