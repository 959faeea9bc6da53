# Sourced by benchmarks/record_suite.sh (SUITE=s20), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs (carry .peer): the stash pool per chunk (NOTES issue 8 section 21: 7.5B v 3 first
# step 309 -> ~150-170 s predicted, step unchanged at ~1.49 s, ~44.5 GiB) and issue 9's
# target 2 (zb-phased v 3 on the 7.5B against the peer's pp4, same lease). Part a (~450 s):
# one GPU, 1.3B v 2, 7.5B v 3, the peer. Part t (~400 s): the 1.3B zb-phased v 2 traced (why
# no gain over 1f1b-phased v 2? the per-row residue), its trace returned. Part b (~250 s): the
# 7.5B zb-phased v 3. Part c (~350 s): issue 10's
# (4,1,1) and issue 11's tensor-parallel layouts of the 1.3B, against part a's one GPU.
export CASE_TIMEOUT=${CASE_TIMEOUT:-420} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
Q75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3"
if [[ "${S20_PART:-a}" == "a" ]]; then
one_gpu
run pp4-phased-v2-sel $ours $B13 --mesh 1,4,1 $PROF_PH parallel.virtual_stages=2
run 7.5b-pp4-phased-v3-sel $ours $Q75 parallel.schedule=1f1b-phased parallel.virtual_stages=3
run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
finish
fi
ZP="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2"
if [[ "${S20_PART}" == "t" ]]; then   # the trace first (~400 s): the per-row residue, and the
  # pipelined-p2p flags (NOTES issue 8 section 21, idea 3) A/B against the traced run's step
  run pp4-zbphased-v2-traced $ours $ZP --trace-dir /tmp/z2 --trace-steps 2 --trace-host-level 0
  f=$(newest_trace /tmp/z2)
  for d in 0 2; do [[ -n "$f" ]] && python3 benchmarks/idle_gaps.py "$f" --device $d --top 15 --min-us 3 > "$out/gaps_zbphased_v2_gpu$d.md" 2>&1; done
  profiled pp4-zbphased-v2-traced /tmp/z2 $ZP
  run pp4-zbphased-v2-p2pflags env XLA_FLAGS="--xla_gpu_enable_pipelined_p2p=true --xla_gpu_collective_permute_decomposer_threshold=0" $ours $ZP
  finish
fi
if [[ "${S20_PART}" == "g" ]]; then   # (~430 s) traced with --xla_enable_command_buffers_
  # during_profiling (then set by capture_step; no effect: part t's trace had its graphs too,
  # NOTES issue 8 section 22). One GPU (the lease's baseline), 1f1b-phased v 2, zb v 2.
  PH2="$B13 --mesh 1,4,1 $PROF_PH parallel.virtual_stages=2"
  for c in "1gpu-none-mb8|1,1,1|$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none" \
           "pp4-phased-v2-sel|1,4,1|$PH2" "pp4-zbphased-v2-sel|1,4,1|$ZP"; do
    IFS='|' read -r tag mesh args <<< "$c"
    dev=(); [[ "$mesh" == "1,1,1" ]] && dev=(env CUDA_VISIBLE_DEVICES=0)
    run "$tag" "${dev[@]}" $ours $args --trace-dir /tmp/g_$tag --trace-steps 2 --trace-host-level 0
    profiled "$tag" /tmp/g_$tag $args
  done
  finish
fi
if [[ "${S20_PART}" == "r" ]]; then   # (~300 s) the fixed cost of a row, which traces cannot
  # show (a traced pipeline step runs ~3.6x its time, command buffers kept or not): a tiny GPT
  # (hidden 32, seq 16, 8 layers: kernels of a few us) whose step is rows x that cost; m 16
  # against m 32 gives the slope. With the loop and the permutes in the command buffers too.
  export CASE_TIMEOUT=150
  CB="--xla_gpu_enable_command_buffer"
  TY="configs/tiny-gpt.yaml --mesh 1,4,1 train.micro_batch_size=1 --steps 20"
  for sv in "zb-phased 2 16 32" "1f1b-phased 1 16"; do
    read -r sc v gbs <<< "$sv"
    for gb in $gbs; do
      run tiny-$sc-v$v-m$gb $ours $TY train.global_batch_size=$gb parallel.schedule=$sc parallel.virtual_stages=$v
    done
    run tiny-$sc-v$v-m16-cbwc env XLA_FLAGS="$CB=+WHILE,+COLLECTIVES" $ours $TY train.global_batch_size=16 parallel.schedule=$sc parallel.virtual_stages=$v
  done
  run tiny-1f1b-m16 $ours $TY train.global_batch_size=16 parallel.schedule=1f1b
  finish
fi
if [[ "${S20_PART}" == "a2" ]]; then   # part a without the 1.3B (part g has it)
  run 7.5b-pp4-phased-v3-sel $ours $Q75 parallel.schedule=1f1b-phased parallel.virtual_stages=3
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  finish
fi
if [[ "${S20_PART}" == "c" ]]; then   # issues 10 and 11 on this lease's cards (one GPU: part a)
export CASE_TIMEOUT=240
run dp4-zero0-bf16-mb4 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16
run tp4-sp-mb16 $ours $B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true
run pp2tp2-phased-v2-sel $ours $B13 --mesh 1,2,2 $PROF_PH parallel.virtual_stages=2
run dp2tp2-sp-mb8-bf16 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16
finish
fi
run 7.5b-pp4-zbphased-v3-sel $ours $Q75 parallel.schedule=zb-phased parallel.virtual_stages=3
