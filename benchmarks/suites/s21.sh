# Sourced by benchmarks/record_suite.sh (SUITE=s21), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs (carry .peer): micro 2 on the 7.5B (NOTES issue 8 section 22: the weight gradients'
# float32 sums per microbatch; the planner puts zb-phased v 3 micro 2 m 16 at 1.4807 s, so
# ~1.51-1.53 s measured, 1.24-1.26x the peer: issue 9 target 2). Part a (~520 s): one GPU,
# the 7.5B zb-phased v 3 at micro 2, the peer. Part b (~450 s): the 7.5B zb-phased v 3 at
# micro 1 (A/B), 1f1b-phased v 3 at micro 2 (planner 1.5096 s). Part c (~400 s): the 1.3B
# plain 1F1B (issue 9 target 1's denominator), zb-phased v 2 micro 1 and v 3 micro 2 (the
# planner's pick, 0.1944 s), 7.5B 1f1b-phased v 1 if time is left (interleaved vs 1F1B).
# Part d (~300 s): NCCL's channels on (4,1,1) and the pipeline (fewer SMs beside compute).
export CASE_TIMEOUT=${CASE_TIMEOUT:-330} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
Q75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3"
M2="train.micro_batch_size=2"
case "${S21_PART:-a}" in
a) one_gpu
   run 7.5b-pp4-zbphased-v3-mb2 $ours $Q75 $M2 parallel.schedule=zb-phased parallel.virtual_stages=3
   run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75 ;;
b) run 7.5b-pp4-zbphased-v3-sel $ours $Q75 parallel.schedule=zb-phased parallel.virtual_stages=3
   run 7.5b-pp4-phased-v3-mb2 $ours $Q75 $M2 parallel.schedule=1f1b-phased parallel.virtual_stages=3 ;;
c) run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b
   run pp4-zbphased-v2-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2
   run pp4-zbphased-v3-mb2 $ours $B13 --mesh 1,4,1 $M2 parallel.schedule=zb-phased parallel.virtual_stages=3
   run 7.5b-pp4-phased-v1-sel $ours $Q75 parallel.schedule=1f1b-phased ;;
d) # NCCL kernels beside compute slow it 1.2-1.9x (NOTES issue 8 section 22): fewer channels,
   # fewer SMs taken (issue 10 section "Session 20"); against part a's one GPU
   DP4="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
   run dp4-zero0-bf16-mb4 $ours $DP4
   run dp4-zero0-bf16-mb4-nch8 env NCCL_MAX_NCHANNELS=8 $ours $DP4
   run dp4-zero0-bf16-mb4-nch4 env NCCL_MAX_NCHANNELS=4 $ours $DP4
   run pp4-zbphased-v2-p2pch2 env NCCL_MAX_P2P_NCHANNELS=2 $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2 ;;
esac
