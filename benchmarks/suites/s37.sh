# Sourced by benchmarks/record_suite.sh (SUITE=s37, S37_PART=a..f). Parts a-e ran on 1x H200
# (the multi-GPU kinds were withheld in session 37); f is prepared for 4 GPUs. Each part's
# prediction and outcome: benchmarks/NOTES.md, session 37.
# a (~6 min): the micro-4 program of a (4,1,1) GPU (global 4, micro 4, m 1) against the
#   one-GPU baseline (global 16, micro 8), both traced (the traces kept for kernel_diff.py),
#   each again under --xla_gpu_enable_triton_gemm=false; and the one GPU at micro 16 (m 1).
# b, c, d (~5 min each): stack_layers' variants (slices into zeros, into lax.empty, behind
#   barriers; none landed) against the previous code, a copy of its ptdp_jax in .old
#   (git-ignored, carried); first benchmarks/stack_probe.py (d: --computed), a step traced.
# e: the one-GPU baseline at micro 16 (m 1) against micro 8 again, A/B/A.
# f (~6 min, 4 GPUs): issue 10 target 1 against both one-GPU baselines measured on every GPU
#   (micro 8, the H100's; micro 16, the H200's best), and one traced micro-16 step for the
#   planner's GEMM curve (results/2026-11-28-s37/planner_micro16.md).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
G4="$B13 --mesh 1,1,1 train.global_batch_size=4 train.micro_batch_size=4 train.recompute=none"
MB16="$ours $B13 --mesh 1,1,1 train.micro_batch_size=16 train.recompute=none"
NOTRITON="env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false"
OLD="env PYTHONPATH=.old"
kept() {   # kept TAG DIR: the newest trace under DIR as OUTDIR/trace_TAG.json.gz
  local f; f=$(newest_trace "$2"); [[ -n "$f" ]] && cp "$f" "$out/trace_$1.json.gz"; rm -rf "$2"
}
old_new() {   # old_new [gb4]: the step A/B/A/B against .old, the first new step traced
  run 1gpu-mb8-new $ONE_GPU --steps 10 --trace-dir /tmp/t_n; kept 1gpu-mb8-new /tmp/t_n
  run 1gpu-mb8-old $OLD $ONE_GPU --steps 10
  if [[ "${1:-}" == gb4 ]]; then
    run 1gpu-gb4-mb4-new $ours $G4 --steps 16
    run 1gpu-gb4-mb4-old $OLD $ours $G4 --steps 16
  fi
}
case "${S37_PART:-a}" in
a) run 1gpu-mb8 $ONE_GPU --steps 10 --trace-dir /tmp/t_a; kept 1gpu-mb8 /tmp/t_a
   run 1gpu-gb4-mb4 $ours $G4 --steps 16 --trace-dir /tmp/t_b; kept 1gpu-gb4-mb4 /tmp/t_b
   run 1gpu-gb4-mb4-notriton $NOTRITON $ours $G4 --steps 16 --trace-dir /tmp/t_c
   kept 1gpu-gb4-mb4-notriton /tmp/t_c
   run 1gpu-mb8-notriton $NOTRITON $ONE_GPU --steps 10 --trace-dir /tmp/t_d
   kept 1gpu-mb8-notriton /tmp/t_d
   run 1gpu-mb16 $MB16 --steps 10
   run 1gpu-mb8-b $ONE_GPU --steps 10 ;;
b|c) timeout 120 python3 benchmarks/stack_probe.py | tee "$out/probe.jsonl"
   old_new gb4
   run 1gpu-mb8-new-b $ONE_GPU --steps 10
   run 1gpu-mb8-old-b $OLD $ONE_GPU --steps 10 ;;
d) timeout 120 python3 benchmarks/stack_probe.py --computed | tee "$out/probe.jsonl"
   old_new
   run 1gpu-mb8-new-dsf env XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $ONE_GPU --steps 10
   run 1gpu-mb8-new-b $ONE_GPU --steps 10
   run 1gpu-mb8-old-b $OLD $ONE_GPU --steps 10 ;;
e) run 1gpu-mb16 $MB16 --steps 10
   run 1gpu-mb8 $ONE_GPU --steps 10
   run 1gpu-mb16-b $MB16 --steps 10 ;;
f) one_gpu_each 8
   one_gpu_each 16
   run dp4-zero2 $ours $DP4A --steps 10
   run dp4-zero2-b $ours $DP4A --steps 10
   run 1gpu-mb16-traced env CUDA_VISIBLE_DEVICES=0 $MB16 --steps 4 --trace-dir /tmp/t_h
   kept 1gpu-mb16 /tmp/t_h ;;
esac
