# Sourced by benchmarks/record_suite.sh (SUITE=s22m), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# One H100 (kind nvidia-h100-x1), session 22: the p = 1 weight gradients' float32 sums inside
# the GEMM (NOTES issue 8 section 24), A/B against BASE (the commit before, carried as .base),
# alternating so that drift falls on both.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
base="env CUDA_VISIBLE_DEVICES=0 PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
new="env CUDA_VISIBLE_DEVICES=0 $ours"
ONE="$B13 --mesh 1,1,1 --steps 8"
run base-1gpu-sel-mb1 $base $ONE train.micro_batch_size=1
run new-1gpu-sel-mb1 $new $ONE train.micro_batch_size=1
run base-1gpu-sel-mb8 $base $ONE train.micro_batch_size=8
run new-1gpu-sel-mb8 $new $ONE train.micro_batch_size=8
run new-1gpu-none-mb8 $new $ONE train.micro_batch_size=8 train.recompute=none
run base-1gpu-none-mb8 $base $ONE train.micro_batch_size=8 train.recompute=none
