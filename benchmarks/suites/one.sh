# Sourced by benchmarks/record_suite.sh (SUITE=one), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# Issue 12 on one GPU: the plain-JAX baseline, our step traced (kept for profile_step.py),
# XLA flag candidates, micro batch and recompute variants.
one="env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/capture_step.py $B13 --mesh 1,1,1"
plain="env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/plain_step.py"
L7="configs/llama-7b.yaml --mesh 1,1,1 model.num_layers=8 train.global_batch_size=8"
lla="env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/capture_step.py $L7"
run plain-dots-mb8 $plain --micro 8
run 1gpu-none-mb8 $one train.micro_batch_size=8 train.recompute=none
run 1gpu-sel-mb8 $one train.micro_batch_size=8
run 1gpu-sel-mb8-scan $one train.micro_batch_size=8 train.scan_layers=true
run llama8-none-mb4 $lla train.micro_batch_size=4 train.recompute=none
run llama8-none-mb2 $lla train.micro_batch_size=2 train.recompute=none
run llama8-sel-mb4 $lla train.micro_batch_size=4 train.recompute=selective
run llama8-sel-mb8 $lla train.micro_batch_size=8 train.recompute=selective
