# Sourced by benchmarks/record_suite.sh (SUITE=dp), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# Issue 10, an A/B: the working tree against BASE (carried), each traced; zero=1; then the
# pipeline without recomputation and a dynamic-slice flag (8). Session 9 ran it with zero=0's
# all-reduce inside the backward as the working tree (results/2026-11-26-s9/).
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
one_gpu
run base-dp4-zero0 $base $DP --trace-dir /tmp/d1; prof base-dp4-zero0 /tmp/d1 4,1,1
run dp4-zero0 $ours $DP --trace-dir /tmp/d2; prof dp4-zero0 /tmp/d2 4,1,1
run dp4-zero0-bf16 $ours $DP parallel.grad_reduce_dtype=bfloat16
run dp4-zero1 $ours $DP parallel.zero=1 --trace-dir /tmp/d3; prof dp4-zero1 /tmp/d3 4,1,1 parallel.zero=1
run dp4-zero1-after $ours $DP parallel.zero=1 parallel.overlap_grad_reduce=false
run dp4-zero1-after-bf16 $ours $DP parallel.zero=1 parallel.overlap_grad_reduce=false parallel.grad_reduce_dtype=bfloat16
run dp2tp2-none-mb8 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none
run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1
run pp4-1f1b-none $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 train.recompute=none --trace-dir /tmp/d4
prof pp4-1f1b-none /tmp/d4 1,4,1 train.micro_batch_size=1 train.recompute=none
run pp4-1f1b-sel-dsf env XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $ours $B13 --mesh 1,4,1 train.micro_batch_size=1
