# Sourced by benchmarks/record_suite.sh (SUITE=s22h), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# One H100 (kind nvidia-h100-x1), session 22: train.keep_ffn_activation (now auto, on under
# selective) against false on the card of the issues' targets, at micro 8 and at micro 1
# (a pipeline stage's microbatch), after the 2x H200 A/B (NOTES issue 8 section 24).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
ONE="env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1"
NOKEEP="train.keep_ffn_activation=false"
one_gpu
run 1gpu-sel-mb8 $ONE train.micro_batch_size=8 --steps 8
run 1gpu-sel-mb8-nokeep $ONE train.micro_batch_size=8 --steps 8 $NOKEEP
run 1gpu-sel-mb1 $ONE train.micro_batch_size=1 --steps 8
run 1gpu-sel-mb1-nokeep $ONE train.micro_batch_size=1 --steps 8 $NOKEEP
run 1gpu-sel-mb8-again $ONE train.micro_batch_size=8 --steps 8
