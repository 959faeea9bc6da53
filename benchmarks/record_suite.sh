#!/usr/bin/env bash
# The record run for benchmarks/RESULTS.md on the 4-GPU machine: our layouts, the one-GPU
# baseline and the PyTorch peer in one lease, with a deadline (cases past it are skipped).
#
#   bash benchmarks/record_suite.sh OUTDIR DEADLINE_S [PEER_DIR]
#   SUITE=flags bash benchmarks/record_suite.sh ...   # XLA command-buffer variants, best one kept
#   SUITE=p4 | s11 | s12 | s13 | s13b | s13c | s14 | s14c | s14d | s15 | s16 | s16c | s16d | s17 | s17c | s18 | s18b | s20 | s21 | s22 | tp2 | llama2 | qkv | attn | peer2 | phased | phased2 | stash2 | stash2b | dp | next | four | one | host | overlap      # the other suites (see each block)
#
# Writes OUTDIR/record.jsonl (one JSON line per case, tagged), OUTDIR/record.log (stderr of
# every case) and OUTDIR/trace_pp4_1f1b.json.gz (a traced step for benchmarks/profile_step.py).
# PEER_DIR: a copy of ../shared/peer (torch_ptd.py), carried to the machine; skipped if absent.
set -u
out=$1; deadline=$2; peer=${3:-.peer}; peer_dir=$peer
mkdir -p "$out"
export PYTHONPATH=${PYTHONPATH:-.}:. PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
start=$(date +%s)
B13="configs/bench-1.3b.yaml"; B75="configs/gpt-7.5b.yaml"
P13="--layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 51200 --micro-batch 1 --global-batch 16 --steps 10 --warmup 3 --dtype bf16"
P75="--layers 36 --hidden 4096 --heads 32 --seq 2048 --vocab 51200 --micro-batch 1 --global-batch 32 --steps 6 --warmup 2 --dtype bf16"
L75="train.global_batch_size=32 train.micro_batch_size=1 parallel.data=1 parallel.tensor=1"
PROF_PH="train.micro_batch_size=1 parallel.schedule=1f1b-phased"   # prof's overrides, phased m 16

run() {   # run TAG COMMAND...: append the command's last JSON line, tagged, to record.jsonl
  local tag=$1; shift
  if (( $(date +%s) - start > deadline )); then
    echo "{\"tag\": \"$tag\", \"error\": \"skipped: deadline\"}" >> "$out/record.jsonl"; return
  fi
  echo "=== $tag: $* (t=$(( $(date +%s) - start ))s)" | tee -a "$out/record.log"
  local line
  line=$(timeout "${CASE_TIMEOUT:-240}" "$@" 2>>"$out/record.log" | grep '^{' | tail -n 1)
  if [[ -n "$line" ]]; then
    python3 -c 'import json,sys; print(json.dumps({"tag": sys.argv[1], **json.loads(sys.argv[2])}))' \
      "$tag" "$line" | tee -a "$out/record.jsonl"
  else
    echo "{\"tag\": \"$tag\", \"error\": \"failed, see record.log\"}" | tee -a "$out/record.jsonl"
  fi
}
ours="python3 benchmarks/capture_step.py"                      # commands, not functions:
peer="torchrun --standalone --nproc-per-node 4 $peer/torch_ptd.py"  # `timeout` runs them

nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tee -a "$out/record.log"
one_gpu() {   # the one-GPU baseline of every ideal: 1.3B, micro 8, no recomputation
  run 1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/capture_step.py $B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none
}
finish() { echo "=== done in $(( $(date +%s) - start ))s" | tee -a "$out/record.log"; exit 0; }
step_of() { python3 -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("tag") == sys.argv[2] and "step_time_s" in r: print(r["step_time_s"])' "$out/record.jsonl" "$1"; }

newest_trace() {   # newest_trace DIR: the newest perfetto trace under DIR, or nothing (a skipped
  # case leaves no DIR: `ls -t` with no arguments would list the working directory)
  find "$1" -name 'perfetto_trace.json.gz' -printf '%T@ %p\n' 2>/dev/null | sort -n | tail -1 | cut -d' ' -f2-
}

traced() {   # traced TAG TRACEDIR: host-time summary of the case's trace into OUTDIR/host_TAG.md
  local f; f=$(newest_trace "$2")
  [[ -n "$f" ]] && python3 benchmarks/host_time.py "$f" --ticks "${3:-57}" > "$out/host_$1.md" 2>&1
  [[ -n "$f" && -n "${KEEP_TRACE:-}" && "$1" == "$KEEP_TRACE" ]] && cp "$f" "$out/trace_$1.json.gz"
  rm -rf "$2"
}

prof() {   # prof TAG TRACEDIR MESH [key=value ...]: kernel time by category into OUTDIR/prof_TAG.md
  local tag=$1 dir=$2 mesh=$3; shift 3
  local f; f=$(newest_trace "$dir")
  [[ -n "$f" ]] && python3 benchmarks/profile_step.py $B13 --mesh "$mesh" --trace "$f" \
    --trace-steps "${TRACE_STEPS:-1}" "$@" > "$out/prof_$tag.md" 2>&1
  [[ -n "$f" ]] && python3 benchmarks/idle_gaps.py "$f" --top 12 >> "$out/prof_$tag.md" 2>&1
  rm -rf "$dir"
}

profiled() {   # profiled TAG TRACEDIR CONFIG --mesh d,p,t [key=value ...]: the case's two traced
  # steps read by profile_step.py against its timed step (and part a's one GPU, if run) into
  # OUTDIR/prof_TAG.md; the trace kept as OUTDIR/trace_TAG.json.gz if under 15 MB
  local tag=$1 dir=$2; shift 2
  local f og; f=$(newest_trace "$dir"); og=$(step_of 1gpu-none-mb8)
  if [[ -n "$f" ]]; then
    python3 benchmarks/profile_step.py "$@" --trace "$f" --trace-steps 2 --top 15 \
      --step-time "$(step_of "$tag")" ${og:+--one-gpu-step $og} > "$out/prof_$tag.md" 2>&1
    (( $(stat -c %s "$f") < 15000000 )) && cp "$f" "$out/trace_$tag.json.gz"
  fi
  rm -rf "$dir"
}

# a suite of its own file: benchmarks/suites/NAME.sh, sourced here with the helpers above
if [[ -f "benchmarks/suites/${SUITE:-record}.sh" ]]; then
  source "benchmarks/suites/${SUITE}.sh"
  finish
fi

if [[ "${SUITE:-record}" == "dp" ]]; then
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
  finish
fi

if [[ "${SUITE:-record}" == "next" ]]; then
  # What session 9 could not run (its device time ended after SUITE=dp's sixth case): zb-v and
  # the pipeline without recomputation against 1f1b and the peer (issues 8, 9), the stash reads
  # as GEMM operands (dynamic-slice fusion), (2,1,2) with cuDNN attention as landed (issue 11),
  # NCCL's Simple protocol for the large all-reduces (issue 10). Carry .peer.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
  PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
  ZBV="parallel.schedule=zb-v parallel.virtual_stages=2"
  DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
  one_gpu
  run pp4-1f1b-sel $ours $PP
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run pp4-zbv-sel $ours $PP $ZBV --trace-dir /tmp/n1; prof pp4-zbv-sel /tmp/n1 1,4,1 train.micro_batch_size=1 $ZBV
  run pp4-1f1b-none $ours $PP train.recompute=none --trace-dir /tmp/n2
  prof pp4-1f1b-none /tmp/n2 1,4,1 train.micro_batch_size=1 train.recompute=none
  run pp4-zbv-none $ours $PP $ZBV train.recompute=none
  run pp4-1f1b-sel-dsf env XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $ours $PP
  run dp2tp2-none-mb8 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none
  run dp4-zero0 $ours $DP
  run dp4-zero0-nccl-simple env NCCL_PROTO=Simple $ours $DP
  run 7.5b-pp4-zbv-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $ZBV parallel.stage_layers=auto --steps 3
  finish
fi

if [[ "${SUITE:-record}" == "phased" ]]; then
  # Issue 8, session 10: 1F1B in forward and backward phases (every op of a tick of one kind)
  # against the halves-1F1B and the peer; the 7.5B both ways; memory at m 32; (1,2,2) for
  # issue 11. Carry .peer. Ordered by priority for a short lease.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
  PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
  PH="parallel.schedule=1f1b-phased"
  one_gpu
  run pp4-1f1b-sel $ours $PP
  run pp4-phased-sel $ours $PP $PH
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $PH --steps 3
  run 7.5b-pp4-1f1b-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3
  run pp4-phased-none $ours $PP $PH train.recompute=none
  run pp4-phased-sel-m32 $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 train.global_batch_size=32 $PH
  run pp2tp2-phased-sel $ours $B13 --mesh 1,2,2 train.micro_batch_size=1 $PH
  run pp4-phased-sel-m8 $ours $B13 --mesh 1,4,1 train.micro_batch_size=2 $PH
  finish
fi

if [[ "${SUITE:-record}" == "p4" ]]; then
  # Issue 8's targets on 4 GPUs, priority order (run it as two calls: P4_PART=a, then b;
  # c: the per-device attention's residuals, A/B against BASE on the t = 2 layouts).
  # a: the one-GPU baseline, 1f1b-phased traced (per-pair breakdown, collectives by op), the
  #    peer, the 7.5B phased and the peer's 7.5B pp4 (targets 1-3);
  # b: interleaved v 2 (1.3B) and v 3 (7.5B), phased peak memory at m 8 and 32 (target 4),
  #    1f1b (halves). Carry .peer.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
  PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
  PH="parallel.schedule=1f1b-phased"
  INT="parallel.schedule=interleaved"
  if [[ "${P4_PART:-a}" == "a" ]]; then
    one_gpu
    run pp4-phased-sel $ours $PP $PH --trace-dir /tmp/p4
    og=$(step_of 1gpu-none-mb8)
    prof pp4-phased-sel /tmp/p4 1,4,1 train.micro_batch_size=1 $PH ${og:+--one-gpu-step $og}
    run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
    run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $PH --steps 3
    run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  elif [[ "${P4_PART}" == "c" ]]; then
    base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
    for lay in "1,2,2 $PH train.micro_batch_size=1" "2,1,2 train.micro_batch_size=8 train.recompute=none"; do
      set -- $lay; m=$1; shift
      run "base-${m//,/}" $base $B13 --mesh $m "$@"
      run "new-${m//,/}" $ours $B13 --mesh $m "$@"
    done
  else
    run pp4-int2-sel $ours $PP $INT parallel.virtual_stages=2
    run pp4-phased-sel-m8 $ours $PP $PH train.global_batch_size=8
    run pp4-phased-sel-m32 $ours $PP $PH train.global_batch_size=32
    run 7.5b-pp4-int3-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $INT parallel.virtual_stages=3 --steps 3
    run pp4-1f1b-sel $ours $PP
  fi
  finish
fi

if [[ "${SUITE:-record}" == "s11" ]]; then
  # Issue 8, session 11, 4 GPUs: the static stash (now the default) at p = 4 with the peer and
  # the 7.5B against the peer's pp4 1f1b in the same lease (target 3). Carry .peer. Priority order.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
  PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
  PH="parallel.schedule=1f1b-phased"
  one_gpu
  run pp4-phased-sel $ours $PP $PH
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective $PH --steps 3
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  run pp4-phased-none $ours $PP $PH train.recompute=none
  run pp4-1f1b-sel $ours $PP
  run pp4-phased-sel-dyn $ours $PP $PH parallel.static_stash=false
  finish
fi

if [[ "${SUITE:-record}" == "phased2" ]]; then
  # The same A/B on 2 GPUs (when no 4-GPU machine is lent): (1,2,1), m 16.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
  PP="$B13 --mesh 1,2,1 train.micro_batch_size=1"
  PH="parallel.schedule=1f1b-phased"
  peer2="torchrun --standalone --nproc-per-node 2 ${3:-.peer}/torch_ptd.py"
  one_gpu
  run pp2-1f1b-sel $ours $PP --trace-dir /tmp/p0; prof pp2-1f1b-sel /tmp/p0 1,2,1 train.micro_batch_size=1
  run pp2-phased-sel $ours $PP $PH --trace-dir /tmp/p1; prof pp2-phased-sel /tmp/p1 1,2,1 train.micro_batch_size=1 $PH
  run peer-pp2-1f1b $peer2 --dp 1 --pp 2 --tp 1 --schedule 1f1b $P13
  run pp2-phased-none $ours $PP $PH train.recompute=none
  run pp2-1f1b-none $ours $PP train.recompute=none
  finish
fi

if [[ "${SUITE:-record}" == "llama2" ]]; then
  # 2 GPUs: LLaMA-7B (8 layers) against BASE (carried: XLA's dot merger on), since the step
  # now turns the merger off for every model (LLaMA's wq/wk/wv and w_gate/w_up share inputs).
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  L7="configs/llama-7b.yaml model.num_layers=8 train.global_batch_size=8 train.recompute=selective"
  run base-llama-1gpu-sel-mb4 env CUDA_VISIBLE_DEVICES=0 $base $L7 --mesh 1,1,1 train.micro_batch_size=4
  run new-llama-1gpu-sel-mb4 env CUDA_VISIBLE_DEVICES=0 $ours $L7 --mesh 1,1,1 train.micro_batch_size=4
  run base-llama-pp2-phased $base $L7 --mesh 1,2,1 $PROF_PH
  run new-llama-pp2-phased $ours $L7 --mesh 1,2,1 $PROF_PH
  finish
fi

if [[ "${SUITE:-record}" == "tp2" ]]; then
  # 2 GPUs: (1,1,2) against BASE (carried: GPT's fused QKV), since q, k, v apart give the
  # partitioned backward three (b, s, h) all-reduces where it had one; then the new default
  # (1,2,1) 1f1b-phased traced, with its optimized HLO.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  TP2="$B13 --mesh 1,1,2 train.micro_batch_size=4 train.recompute=none"
  run base-tp2-none-mb4 $base $TP2
  run new-tp2-none-mb4 $ours $TP2 --hlo-dir /tmp/h1
  python3 benchmarks/hlo_copies.py /tmp/h1/step_after_optimizations.txt > "$out/hlo_tp2.md" 2>&1
  grep -c "all-reduce-start\|all-reduce(" /tmp/h1/step_after_optimizations.txt >> "$out/hlo_tp2.md"
  gzip -c /tmp/h1/step_after_optimizations.txt > "$out/hlo_tp2.txt.gz"
  run new-pp2-phased-sel $ours $B13 --mesh 1,2,1 $PROF_PH --trace-dir /tmp/t2
  prof new-pp2-phased-sel /tmp/t2 1,2,1 $PROF_PH
  finish
fi

if [[ "${SUITE:-record}" == "s14" ]]; then
  # 4 GPUs, what session 13's short 4-GPU lease left (priority order; carry .peer for b):
  # a: the one-GPU baseline; (1,4,1) 1f1b-phased traced over two steps, the second read (the
  #    first was skewed by the profiler's start); the 7.5B interleaved v 3 (target 3's other
  #    half); (4,1,1) zero 0 and zero 1 after the backward (issue 10 target 1); (1,1,4) with
  #    sequence parallelism by rows and without, and with parallel.tp_comm_overlap, traced
  #    (issue 11 target 2); the overlap probe with the dot merger off, t = 4 and t = 2.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-200} TRACE_STEPS=2
  PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
  DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
  TP="$B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none"
  # Two calls: S14_PART=a (up to the probes), then S14_PART=b (the 7.5B cases and the flags).
  if [[ "${S14_PART:-a}" == "a" ]]; then
  one_gpu
  og=$(step_of 1gpu-none-mb8)
  run pp4-phased-sel $ours $PP parallel.schedule=1f1b-phased --trace-dir /tmp/s4 --trace-steps 2
  prof pp4-phased-sel /tmp/s4 1,4,1 $PROF_PH ${og:+--one-gpu-step $og}
  run 7.5b-pp4-int3-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=interleaved parallel.virtual_stages=3 --steps 3
  run dp4-zero0 $ours $DP
  run dp4-zero1-after $ours $DP parallel.zero=1 parallel.overlap_grad_reduce=false
  run tp4-sp-mb4 $ours $TP parallel.sequence_parallel=true
  run tp4-mb4 $ours $TP
  run tp4-sp-ov-mb4 $ours $TP parallel.sequence_parallel=true parallel.tp_comm_overlap=true --trace-dir /tmp/s5
  prof tp4-sp-ov-mb4 /tmp/s5 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true parallel.tp_comm_overlap=true
  python3 benchmarks/overlap_probe.py 2>&1 | grep '^{' | tee -a "$out/record.jsonl"
  CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/overlap_probe.py 2>&1 | grep '^{' | tee -a "$out/record.jsonl"
  finish
  fi
  run tp4-sp-ov-mb4 $ours $TP parallel.sequence_parallel=true parallel.tp_comm_overlap=true
  # issue 11 target 1: the 7.5B at (1,1,4) without recomputation fits with sequence
  # parallelism at micro 4 (estimate 43.4 GiB; without it 53.3), split by rows
  T75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true --steps 3"
  run 7.5b-tp4-sp-none-mb4 $ours $T75
  run 7.5b-tp4-sp-ov-none-mb4 $ours $T75 parallel.tp_comm_overlap=true
  run 7.5b-tp4-sel-mb2 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=2 train.recompute=selective --steps 3
  # issue 10 target 2: the 7.5B (4,1,1) zero=3, layer scan (auto) against unrolled layers
  Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.micro_batch_size=1 parallel.zero=3 --steps 3"
  run 7.5b-dp4-zero3-scan-sel $ours $Z75 train.recompute=selective
  run 7.5b-dp4-zero3-unrolled-sel $ours $Z75 train.recompute=selective train.scan_layers=false
  run 7.5b-dp4-zero3-unrolled-none $ours $Z75 train.recompute=none train.scan_layers=false
  # flags, last: cuBLAS instead of Triton for the micro-1 GEMMs (2048^3 at ~650 TFLOP/s in
  # Triton at p = 2); XLA combining zero=1's per-layer reduce-scatters into larger ones (fewer
  # NCCL kernels under the backward's element-wise work, session 9)
  run pp4-phased-sel-cublas env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false $ours $PP parallel.schedule=1f1b-phased
  run dp4-zero1-rs256 env XLA_FLAGS=--xla_gpu_reduce_scatter_combine_threshold_bytes=268435456 $ours $DP parallel.zero=1
  run dp4-zero1 $ours $DP parallel.zero=1
  finish
fi

if [[ "${SUITE:-record}" == "s15" ]]; then
  # 4 GPUs, session 15, three calls in one lease with the same OUTDIR (b reads a's one-GPU
  # step from record.jsonl); carry .peer. Predictions: NOTES, issue 10 "Session 14, after the
  # lease" and issue 11 "Session 14". S15_PART=a: the one-GPU step, the 7.5B data-parallel
  # layouts (zero 1, 2, 3) and the peer's FSDP (issue 10 target 2). b: the pipeline traced
  # with a pause between its two traced steps (issue 8), tp_comm_overlap at micro 16 / 8
  # (issue 11). c: bf16 reductions and the (1,1,2) overlap A/B, traced.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-200} TRACE_STEPS=2
  Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
  if [[ "${S15_PART:-a}" == "a" ]]; then
  one_gpu
  run 7.5b-dp4-zero1-sel-mb1 $ours $Z75 train.micro_batch_size=1 parallel.zero=1
  run 7.5b-dp4-zero2-sel-mb2 $ours $Z75 train.micro_batch_size=2 parallel.zero=2
  run 7.5b-dp4-zero2-sel-mb2-bf16 $ours $Z75 train.micro_batch_size=2 parallel.zero=2 parallel.grad_reduce_dtype=bfloat16
  run 7.5b-dp4-zero2-sel-mb1 $ours $Z75 train.micro_batch_size=1 parallel.zero=2
  run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
  run 7.5b-dp4-zero3-unrolled-sel-mb2 $ours $Z75 train.micro_batch_size=2 parallel.zero=3 train.scan_layers=false
  finish
  fi
  if [[ "${S15_PART:-a}" == "b" ]]; then
  og=$(step_of 1gpu-none-mb8)
  run pp4-phased-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased --trace-dir /tmp/s6 --trace-steps 2
  prof pp4-phased-sel /tmp/s6 1,4,1 $PROF_PH ${og:+--one-gpu-step $og}
  # tp_comm_overlap where its permutes are fewer per token (NOTES issue 11, session 14)
  TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
  run tp4-sp-mb16 $ours $TP4
  run tp4-sp-ov-mb16 $ours $TP4 parallel.tp_comm_overlap=true
  T75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true --steps 3"
  run 7.5b-tp4-sp-none-mb8 $ours $T75
  run 7.5b-tp4-sp-ov-none-mb8 $ours $T75 parallel.tp_comm_overlap=true
  finish
  fi
  DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
  run dp4-zero1-after-bf16 $ours $DP parallel.zero=1 parallel.overlap_grad_reduce=false parallel.grad_reduce_dtype=bfloat16
  run dp2tp2-sp-mb8-bf16 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16
  TP2="$B13 --mesh 1,1,2 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true"
  run tp2-sp-mb4 env CUDA_VISIBLE_DEVICES=0,1 $ours $TP2
  run tp2-sp-ov-mb4 env CUDA_VISIBLE_DEVICES=0,1 $ours $TP2 parallel.tp_comm_overlap=true --trace-dir /tmp/s7
  prof tp2-sp-ov-mb4 /tmp/s7 1,1,2 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true parallel.tp_comm_overlap=true
  finish
fi

if [[ "${SUITE:-record}" == "s22" ]]; then
  # 4 GPUs (carry .peer): session 21's executor changes, each A/B in one lease (NOTES issue 8
  # section 23), and issue 9 target 2 again (session 21, 4x H200: zb-phased v 3 micro 2
  # 1.4674 s, 1.229x the peer; 1.25x needs the peer's step / 1.25):
  #   uninitialised buffers (parallel.empty_buffers=true) against the default (zeros);
  #   parallel.overlap_p2p=true (the forward rows' messages under the backward rows' ops);
  #   train.keep_ffn_activation=true (no GeLU recompute; the planner says ~1% slower).
  # Part a (~310 s): one GPU, the 7.5B zb-phased v 3 micro 2 (12 steps), the peer. Part b
  # (~460 s): the same 7.5B with parallel.empty_buffers=true, then with overlap_p2p. Part c
  # (~400 s): the 1.3B zb-phased v 2 three ways (HLO copies counted). Part d (~400 s): the
  # 1.3B plain 1f1b (issue 9 target 1) and zb-phased v 2 with keep_ffn_activation, NCCL
  # channels up (cached programs), the (4,1,1) at zero 2 and 1 with a bf16 reduction (issue
  # 10: a sharded update).
  export CASE_TIMEOUT=${CASE_TIMEOUT:-330} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  ZB75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 12 train.micro_batch_size=2 parallel.schedule=zb-phased parallel.virtual_stages=3"
  ZB13="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2 --steps 10"
  DP4="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
  OV="parallel.overlap_p2p=true"
  case "${S22_PART:-a}" in
  a) one_gpu
     run 7.5b-pp4-zbphased-v3-mb2 $ours $ZB75
     run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75 ;;
  b) run 7.5b-pp4-zbphased-v3-mb2-emptybuf $ours $ZB75 parallel.empty_buffers=true
     run 7.5b-pp4-zbphased-v3-mb2-overlap $ours $ZB75 $OV ;;
  c) run pp4-zbphased-v2-sel-emptybuf $ours $ZB13 parallel.empty_buffers=true --hlo-dir /tmp/h_new
     run pp4-zbphased-v2-sel $ours $ZB13 --hlo-dir /tmp/h_old
     run pp4-zbphased-v2-sel-overlap $ours $ZB13 $OV
     for d in new old; do [[ -f /tmp/h_$d/step_after_optimizations.txt ]] && python3 benchmarks/hlo_copies.py /tmp/h_$d/step_after_optimizations.txt --min-mb 1 --top 20 > "$out/copies_zbphased_v2_$d.md" 2>&1; done ;;
  d) run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b
     run pp4-zbphased-v2-keepact $ours $ZB13 train.keep_ffn_activation=true
     run pp4-zbphased-v2-again $ours $ZB13
     run pp4-zbphased-v2-p2pmin16 env NCCL_MIN_P2P_NCHANNELS=16 $ours $ZB13
     run dp4-zero0-bf16-mb4 $ours $DP4
     run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2
     run dp4-zero1-bf16-mb4 $ours $DP4 parallel.zero=1
     run dp4-zero0-bf16-mb4-minch32 env NCCL_MIN_NCHANNELS=32 $ours $DP4 ;;
  esac
  finish
fi

if [[ "${SUITE:-record}" == "s21" ]]; then
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
  finish
fi

if [[ "${SUITE:-record}" == "s20" ]]; then
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
  finish
fi

if [[ "${SUITE:-record}" == "s18b" ]]; then
  # 4 GPUs (carry .peer): 1f1b-phased interleaved (v > 1) against v = 1 (NOTES issue 8
  # section 20; s18's lease 2 ran v > 1 as rounds of loops, which did not compile in time).
  # Part a (~450 s): a tiny v 2 compile check, the 1.3B m 16 v 1 and v 2, the peer's 7.5B pp4
  # 1F1B. Part b (~400 s): the 7.5B m 32 v 1 and v 3 ("interleaved faster than 1F1B").
  # Part c (~400 s): the 7.5B zb-phased v 3, then zb-phased 1.3B traced, one tick a row.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-330} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  PP="$B13 --mesh 1,4,1 $PROF_PH"
  Q75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3 parallel.schedule=1f1b-phased"
  TINY="$B13 --mesh 1,4,1 $PROF_PH model.num_layers=8 model.hidden_size=512 model.num_heads=8 --steps 2"
  tiny_ok() { [[ -n "$(step_of tiny-pp4-phased-v2)" ]]; }
  if [[ "${S18B_PART:-a}" == "a" ]]; then
  CASE_TIMEOUT=150 run tiny-pp4-phased-v2 $ours $TINY parallel.virtual_stages=2
  run pp4-phased-sel $ours $PP
  if tiny_ok; then
  run pp4-phased-v2-sel $ours $PP parallel.virtual_stages=2
  else   # a compile that grows (XLA's loop unrolling, the region-based copy insertion that the
         # static stash turns on) or a hang? the tiny case without each
  CASE_TIMEOUT=150 run tiny-pp4-phased-v2-nounroll env XLA_FLAGS=--xla_gpu_enable_while_loop_unrolling=WHILE_LOOP_UNROLLING_NO_UNROLL $ours $TINY parallel.virtual_stages=2
  CASE_TIMEOUT=150 run tiny-pp4-phased-v2-dynstash $ours $TINY parallel.virtual_stages=2 parallel.static_stash=false
  fi
  one_gpu
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  finish
  fi
  if [[ "${S18B_PART}" == "b" ]]; then
  run 7.5b-pp4-phased-sel $ours $Q75
  run 7.5b-pp4-phased-v3-sel $ours $Q75 parallel.virtual_stages=3
  finish
  fi
  run 7.5b-pp4-zbphased-v3-sel $ours ${Q75/1f1b-phased/zb-phased} parallel.virtual_stages=3
  ZP="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased"
  run pp4-zbphased-sel-traced $ours $ZP --trace-dir /tmp/z1 --trace-steps 2 --trace-host-level 0
  f=$(newest_trace /tmp/z1); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $ZP --trace "$f" --trace-steps 2 --top 12 --step-time "$(step_of pp4-zbphased-sel-traced)" > "$out/prof_zbphased_rows.md" 2>&1; rm -rf /tmp/z1
  finish
fi

if [[ "${SUITE:-record}" == "s18" ]]; then
  # 4 GPUs, session 18 (carry .peer). Part a: zb-phased against 1f1b-phased (NOTES issue 9,
  # "Session 17": -3% predicted at 1.3B m 16; 1f1b-phased itself, one permute a row, -1 to
  # -3 ms against s17's 0.1914 s), its trace (copies of the W stash?), and the
  # pipeline without recomputation traced (why +9.5%?). Part b: the 7.5B pp4 both ways and the
  # peer's pp4 (issue 9 target 2), then on H100 the 7.5B (1,1,4) SP (issue 11 target 1).
  export CASE_TIMEOUT=${CASE_TIMEOUT:-220} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  PP="$B13 --mesh 1,4,1 $PROF_PH"
  ZP="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased"
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  if [[ "${S18_PART:-a}" == "a" ]]; then
  one_gpu
  run base-pp4-phased-sel $base $PP      # .base: two permutes a row (git archive 36654a6)
  run pp4-phased-sel $ours $PP
  run pp4-zbphased-sel $ours $ZP
  run pp4-zbphased-sel-traced $ours $ZP --trace-dir /tmp/z1 --trace-steps 2 --trace-host-level 0
  f=$(newest_trace /tmp/z1); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $B13 --mesh 1,4,1 --trace "$f" --trace-steps 2 --top 25 train.micro_batch_size=1 parallel.schedule=zb-phased > "$out/prof_zbphased.md" 2>&1; rm -rf /tmp/z1
  run pp4-phased-sel-again $ours $PP
  run pp4-phased-none-traced $ours $PP train.recompute=none --trace-dir /tmp/n1 --trace-steps 2 --trace-host-level 0
  f=$(newest_trace /tmp/n1); [[ -n "$f" ]] && python3 benchmarks/profile_step.py $B13 --mesh 1,4,1 --trace "$f" --trace-steps 2 --top 25 $PROF_PH train.recompute=none > "$out/prof_phased_none.md" 2>&1; rm -rf /tmp/n1
  finish
  fi
  Q75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 3"
  run 7.5b-pp4-zbphased-sel $ours $Q75 parallel.schedule=zb-phased
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  run 7.5b-pp4-phased-sel $ours $Q75 parallel.schedule=1f1b-phased
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  (( ${mib:-0} < 100000 )) && run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 3
  finish
fi

if [[ "${SUITE:-record}" == "s17c" ]]; then
  # 4 GPUs, session 17, lease 2 (carry .peer and .base = 6f0cf44). Part a: 1f1b-phased as
  # warm-up / steady pairs / cool-down loops against .base (the same call, A B A B, the repeats
  # from JAX's compilation cache), the pipeline without recomputation, and NCCL's protocol
  # (what s17 b's deadline skipped). Part b: the 7.5B pp4 against the peer's on this card.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-200} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
  export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  PP="$B13 --mesh 1,4,1 $PROF_PH"
  if [[ "${S17C_PART:-a}" == "a" ]]; then
  one_gpu
  run base-pp4-phased-sel $base $PP
  run pp4-phased-sel $ours $PP
  run base-pp4-phased-sel-again $base $PP
  run pp4-phased-sel-again $ours $PP
  run pp4-phased-none $ours $PP train.recompute=none
  T13="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
  D13="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2"
  run tp4-sp-mb16 $ours $T13
  run tp4-sp-mb16-simple env NCCL_PROTO=Simple $ours $T13
  run dp4-zero2-bf16 $ours $D13                       # last: the deadline may skip these two
  run dp4-zero2-bf16-simple env NCCL_PROTO=Simple $ours $D13
  finish
  fi
  run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=1f1b-phased --steps 3
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  run base-7.5b-pp4-phased-sel $base $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=1f1b-phased --steps 3
  finish
fi

if [[ "${SUITE:-record}" == "s17" ]]; then
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
  finish
fi

if [[ "${SUITE:-record}" == "s16" ]]; then
  # 4 GPUs, session 16, two calls in one lease (carry .peer). Predictions: NOTES, issue 10
  # "Session 15". S16_PART=a: the zero-dim change on the 7.5B zero 2 micro 8 (traced: are the
  # optimizer's transposes gone?), zero 3 at m = 1 (its per-layer gathers under the layers),
  # the peer's FSDP in the lease (issue 10 target 2). b: the 1.3B data-parallel rows
  # (target 1) and (2,1,2) (issue 11 target 2) against the same lease's one-GPU step.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-200} TRACE_STEPS=2
  Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
  # micro 8 needs ~106 GiB (H200); on 80 GB cards micro 2 (67.6 GiB) is the largest that fits
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
  MB=8; (( ${mib:-0} < 100000 )) && MB=2
  if [[ "${S16_PART:-a}" == "a" ]]; then
  run 7.5b-dp4-zero2-mb$MB-bf16 $ours $Z75 train.micro_batch_size=$MB parallel.zero=2 parallel.grad_reduce_dtype=bfloat16 --trace-dir /tmp/s8 --trace-steps 2
  f=$(newest_trace /tmp/s8); [[ -n "$f" ]] && python3 benchmarks/idle_gaps.py "$f" --top 12 > "$out/gaps_zero2.md" 2>&1
  [[ -n "$f" ]] && cp "$f" "$out/trace_7.5b-dp4-zero2-mb$MB-bf16.json.gz"; rm -rf /tmp/s8
  run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
  run 7.5b-dp4-zero3-unrolled-mb$MB-bf16 $ours $Z75 train.micro_batch_size=$MB parallel.zero=3 train.scan_layers=false parallel.grad_reduce_dtype=bfloat16
  run 7.5b-dp4-zero2-mb$MB $ours $Z75 train.micro_batch_size=$MB parallel.zero=2
  run 7.5b-dp4-zero2-mb2 $ours $Z75 train.micro_batch_size=2 parallel.zero=2
  # on 80 GB cards the pipeline is the other candidate (session 13: 1.556 s on 4x H200)
  (( MB == 2 )) && run 7.5b-pp4-phased-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=1f1b-phased --steps 3
  # ptdp-plan's pick on 4x H100 (predicted 1.487 s): (2,2,1) 1f1b-phased zero 1, micro 1
  (( MB == 2 )) && run 7.5b-dp2pp2-phased-zero1 $ours $B75 --mesh 2,2,1 train.global_batch_size=32 train.micro_batch_size=1 train.recompute=selective parallel.schedule=1f1b-phased parallel.zero=1 --steps 3
  run peer-7.5b-dp4-fsdp-again $peer --dp 4 --pp 1 --tp 1 $P75
  finish
  fi
  one_gpu
  DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
  run dp4-zero0-bf16 $ours $DP
  run dp4-zero2-bf16 $ours $DP parallel.zero=2
  run dp4-zero1-bf16 $ours $DP parallel.zero=1
  run dp2tp2-sp-mb8-bf16 $ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16
  # the pipeline traced with the device tracer only: does the 2.2x stretch of session 15's
  # traced step (444 ms against 201) go? (NOTES issue 8 section 17)
  run pp4-phased-sel-devtrace $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased --trace-dir /tmp/s9 --trace-steps 2 --trace-host-level 0
  og=$(step_of 1gpu-none-mb8)
  prof pp4-phased-sel-devtrace /tmp/s9 1,4,1 $PROF_PH ${og:+--one-gpu-step $og}
  finish
fi

if [[ "${SUITE:-record}" == "s16c" ]]; then
  # 4 GPUs, session 16, lease 2: the per-layer gradient sums (NOTES issue 10 "Session 16") as
  # an A/B against BASE (carried: the tree before, 4114917), then issue 8 target 2 (the peer's
  # pp4 1F1B on the 1.3B) and issue 11 target 1 on H100 (7.5B tp4 SP). Carry .base and .peer.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
  Z75="$Z75 train.micro_batch_size=2 parallel.zero=2 parallel.grad_reduce_dtype=bfloat16"
  DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
  ONE="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none"
  run base-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $base $ONE
  run 1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $ONE
  run base-7.5b-dp4-zero2-mb2-bf16 $base $Z75
  run 7.5b-dp4-zero2-mb2-bf16 $ours $Z75
  run base-dp4-zero0-bf16 $base $DP
  run dp4-zero0-bf16 $ours $DP
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run pp4-phased-sel $ours $B13 --mesh 1,4,1 $PROF_PH
  run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 3
  finish
fi

if [[ "${SUITE:-record}" == "s16d" ]]; then
  # lease 3: the per-layer sums kept as a list (s16c's scatter-add into the stack: +25%)
  export CASE_TIMEOUT=${CASE_TIMEOUT:-110}
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.recompute=selective --steps 3"
  Z75="$Z75 train.micro_batch_size=2 parallel.zero=2 parallel.grad_reduce_dtype=bfloat16"
  ONE="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none --steps 6"
  run base-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $base $ONE
  run 1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $ONE
  run 7.5b-dp4-zero2-mb2-bf16 $ours $Z75
  run base-7.5b-dp4-zero2-mb2-bf16 $base $Z75
  finish
fi

if [[ "${SUITE:-record}" == "s14c" ]]; then
  # 4 GPUs, the same lease as s14 b: the flags and what s14's deadline skipped
  export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
  PP="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased"
  DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
  T75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none --steps 3"
  run pp4-phased-sel-cublas env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false $ours $PP
  run 7.5b-tp4-sp-none-mb8 $ours $T75 train.micro_batch_size=8 parallel.sequence_parallel=true
  run 7.5b-tp4-none-mb4 $ours $T75 train.micro_batch_size=4
  run dp4-zero0-bf16 $ours $DP parallel.grad_reduce_dtype=bfloat16
  run 7.5b-dp4-zero3-unrolled-none $ours $B75 --mesh 4,1,1 train.global_batch_size=32 train.micro_batch_size=1 parallel.zero=3 --steps 3 train.recompute=none train.scan_layers=false
  finish
fi

if [[ "${SUITE:-record}" == "s14d" ]]; then
  # 4 GPUs, the same lease: issue 11 target 2, the 1.3B with tensor parallelism at larger micro
  export CASE_TIMEOUT=${CASE_TIMEOUT:-120}
  T13="$B13 train.recompute=none"
  run tp4-sp-mb16 $ours $T13 --mesh 1,1,4 train.micro_batch_size=16 parallel.sequence_parallel=true
  run tp4-sp-mb8 $ours $T13 --mesh 1,1,4 train.micro_batch_size=8 parallel.sequence_parallel=true
  run dp2tp2-sp-mb8 $ours $T13 --mesh 2,1,2 train.micro_batch_size=8 parallel.sequence_parallel=true
  run pp2tp2-sp-mb2 $ours $T13 --mesh 1,2,2 train.micro_batch_size=2 parallel.sequence_parallel=true parallel.schedule=1f1b-phased
  run tp4-mb16 $ours $T13 --mesh 1,1,4 train.micro_batch_size=16
  finish
fi

if [[ "${SUITE:-record}" == "s13" ]]; then
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
  finish
fi

if [[ "${SUITE:-record}" == "s13b" ]]; then
  # 2 GPUs: sequence parallelism split by rows (t divides micro 4) against BASE (carried: by
  # sequence), the new one traced; micro 8 with and without it; the collective-permute overlap
  # probe with XLA's defaults and with the latency-hiding scheduler forced on.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  TP2="$B13 --mesh 1,1,2 train.recompute=none"
  SP="parallel.sequence_parallel=true"
  python3 benchmarks/overlap_probe.py 2>&1 | tee -a "$out/record.jsonl"
  XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true python3 benchmarks/overlap_probe.py 2>&1 \
    | sed 's/"case": "/"case": "lhs-/' | tee -a "$out/record.jsonl"
  run base-tp2-sp-mb4 $base $TP2 train.micro_batch_size=4 $SP
  run new-tp2-sp-mb4 $ours $TP2 train.micro_batch_size=4 $SP --trace-dir /tmp/b1
  prof new-tp2-sp-mb4 /tmp/b1 1,1,2 train.micro_batch_size=4 train.recompute=none $SP
  run new-tp2-sp-mb8 $ours $TP2 train.micro_batch_size=8 $SP
  run new-tp2-mb8 $ours $TP2 train.micro_batch_size=8
  finish
fi

if [[ "${SUITE:-record}" == "s13c" ]]; then
  # 2 GPUs: the overlap probe traced (do the permutes run under the GEMMs, on which streams),
  # then with XLA's windowed einsum (its own collective matmul), in the probe and in (1,1,2)
  # with sequence parallelism split by rows (session 11 tried it with the sequence split).
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  WE="--xla_gpu_threshold_for_windowed_einsum_mib=0 --xla_gpu_multi_streamed_windowed_einsum=true"
  TP2="$B13 --mesh 1,1,2 train.recompute=none parallel.sequence_parallel=true"
  python3 benchmarks/overlap_probe.py --trace /tmp/p1 2>&1 | grep '^{' | tee -a "$out/record.jsonl"
  XLA_FLAGS="$WE" python3 benchmarks/overlap_probe.py --trace /tmp/p2 2>&1 | grep '^{' \
    | sed 's/"case": "/"case": "we-/' | tee -a "$out/record.jsonl"
  run tp2-sp-mb4-we env XLA_FLAGS="$WE" $ours $TP2 train.micro_batch_size=4
  run tp2-sp-mb4 $ours $TP2 train.micro_batch_size=4
  run tp2-sp-mb8-we env XLA_FLAGS="$WE" $ours $TP2 train.micro_batch_size=8
  finish
fi

if [[ "${SUITE:-record}" == "s12" ]]; then
  # 2 GPUs, session 12's defaults (flash attention kept, q, k, v apart, no dot merger) against
  # BASE (carried: before q, k, v apart), with the one-GPU baseline both ways and the peer.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  peer2="torchrun --standalone --nproc-per-node 2 ${3:-.peer}/torch_ptd.py"
  PP2="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased"
  S1="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none"
  one_gpu
  run base-1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $base $S1
  run new-pp2-phased-sel $ours $PP2
  run base-pp2-phased-sel $base $PP2
  run peer-pp2-1f1b $peer2 --dp 1 --pp 2 --tp 1 --schedule 1f1b $P13
  run new-pp2-1f1b-sel $ours $B13 --mesh 1,2,1 train.micro_batch_size=1
  finish
fi

if [[ "${SUITE:-record}" == "qkv" ]]; then
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
  finish
fi

if [[ "${SUITE:-record}" == "attn" ]]; then
  # 2 GPUs, A/B against BASE (carried): selective recomputation keeping the flash attention's
  # outputs instead of running its forward again; (1,2,1) 1f1b-phased traced, the optimized HLO
  # of the new step (for hlo_copies.py --where), and the one-GPU selective step.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  PP2="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased"
  one_gpu
  run base-pp2-phased-sel $base $PP2 --trace-dir /tmp/a1; prof base-pp2-phased-sel /tmp/a1 1,2,1 $PROF_PH
  run new-pp2-phased-sel $ours $PP2 --trace-dir /tmp/a2 --hlo-dir /tmp/h2
  prof new-pp2-phased-sel /tmp/a2 1,2,1 $PROF_PH
  gzip -c /tmp/h2/step_after_optimizations.txt > "$out/hlo_pp2_phased.txt.gz" 2>/dev/null
  S1="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=selective"
  run base-1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 $base $S1
  run new-1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $S1
  finish
fi

if [[ "${SUITE:-record}" == "peer2" ]]; then
  # 2 GPUs: our default 1f1b-phased (static stash) against the peer's pp2 1f1b, with the one-GPU
  # baseline, (1,2,1) m 16. Carry .peer.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
  peer2="torchrun --standalone --nproc-per-node 2 ${3:-.peer}/torch_ptd.py"
  one_gpu
  run pp2-phased-sel $ours $B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased
  run peer-pp2-1f1b $peer2 --dp 1 --pp 2 --tp 1 --schedule 1f1b $P13
  finish
fi

if [[ "${SUITE:-record}" == "stash2" ]]; then
  # The residual stash, a buffer per slot (parallel.static_stash) against one stacked buffer
  # indexed per tick, on (1,2,1) m 16 (2 GPUs); copies in the optimized HLO (hlo_copies.py).
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  PP="$B13 --mesh 1,2,1 train.micro_batch_size=1"
  PH="parallel.schedule=1f1b-phased"; ST="parallel.static_stash=true"
  hlo() { python3 benchmarks/hlo_copies.py /tmp/h_$1/step_after_optimizations.txt > "$out/hlo_$1.md" 2>&1; rm -rf /tmp/h_$1; }
  one_gpu
  run pp2-phased-sel $ours $PP $PH --hlo-dir /tmp/h_a --trace-dir /tmp/p0; hlo a; prof pp2-phased-sel /tmp/p0 1,2,1 train.micro_batch_size=1 $PH
  run pp2-phased-sel-static $ours $PP $PH $ST --hlo-dir /tmp/h_b --trace-dir /tmp/p1; hlo b; prof pp2-phased-sel-static /tmp/p1 1,2,1 train.micro_batch_size=1 $PH $ST
  run pp2-phased-none $ours $PP $PH train.recompute=none
  run pp2-phased-none-static $ours $PP $PH $ST train.recompute=none
  run pp2-1f1b-sel $ours $PP
  run pp2-1f1b-sel-static $ours $PP $ST
  finish
fi

if [[ "${SUITE:-record}" == "stash2b" ]]; then
  # parallel.static_stash on the other schedules, (1,2,1) m 16, each against the dynamic stash.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  PP="$B13 --mesh 1,2,1 train.micro_batch_size=1"; ST="parallel.static_stash=true"
  I2="parallel.schedule=interleaved parallel.virtual_stages=2"
  ZV="parallel.schedule=zb-v parallel.virtual_stages=2"
  run pp2-1f1b-sel $ours $PP
  run pp2-1f1b-sel-static $ours $PP $ST
  run pp2-i2-sel $ours $PP $I2
  run pp2-i2-sel-static $ours $PP $I2 $ST
  run pp2-zbv-sel $ours $PP $ZV
  run pp2-zbv-sel-static $ours $PP $ZV $ST
  finish
fi

if [[ "${SUITE:-record}" == "overlap" ]]; then
  # XLA flags for overlapping communication, each against its case without them (issues 10, 11).
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  WE="--xla_gpu_threshold_for_windowed_einsum_mib=0 --xla_gpu_multi_streamed_windowed_einsum=true"
  AR="--xla_gpu_all_reduce_combine_threshold_bytes=67108864"
  one_gpu
  run dp4-zero0-none-mb4 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none
  run dp4-zero0-none-mb4-ar64m env XLA_FLAGS="$AR" $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none
  run 1.3b-tp4-sp-none-mb4 $ours $B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true
  run 1.3b-tp4-sp-none-mb4-we env XLA_FLAGS="$WE" $ours $B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true
  run 7.5b-tp4-sp-sel-we env XLA_FLAGS="$WE" $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective parallel.sequence_parallel=true --steps 3
  run 7.5b-tp4-sel-we env XLA_FLAGS="$WE" $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective --steps 3
  run 7.5b-tp4-sp-sel $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective parallel.sequence_parallel=true --steps 3
  finish
fi

if [[ "${SUITE:-record}" == "four" ]]; then
  # One lease for issues 10, 11 and 8: the one-GPU baseline, data parallelism with the state
  # split (zero), tensor parallelism with sequence parallelism, the pipeline, and the peer.
  export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
  one_gpu
  run dp4-zero0-none-mb4 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none
  run dp4-zero1-none-mb4 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.zero=1
  run 7.5b-tp4-sp-sel $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective parallel.sequence_parallel=true --steps 3
  run 7.5b-tp4-sel $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective --steps 3
  run 7.5b-dp4-zero3-sel $ours $B75 --mesh 4,1,1 $L75 parallel.data=4 train.recompute=selective parallel.zero=3 --steps 3
  run peer-7.5b-dp4-fsdp $peer --dp 4 --pp 1 --tp 1 $P75
  run pp4-1f1b-m16-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run pp4-zbh1-m16-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-h1
  run 1.3b-tp4-sp-none-mb4 $ours $B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true
  finish
fi

if [[ "${SUITE:-record}" == "one" ]]; then
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
  finish
fi

if [[ "${SUITE:-record}" == "host" ]]; then
  # A/B of a code change against BASE (an export of the previous commit, carried), with the
  # host-time summary of each traced case (benchmarks/host_time.py).
  base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
  CB="--xla_gpu_enable_command_buffer"
  run 1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/capture_step.py $B13 --mesh 1,1,1 train.micro_batch_size=8
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run base-pp4-1f1b $base $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/t1; traced base-pp4-1f1b /tmp/t1
  run base-pp4-1f1b-nocond env XLA_FLAGS="$CB=-CONDITIONAL" $base $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/t2; traced base-pp4-1f1b-nocond /tmp/t2
  run new-pp4-1f1b $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/t3; traced new-pp4-1f1b /tmp/t3
  run new-pp4-int2 $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=interleaved parallel.virtual_stages=2 --trace-dir /tmp/t4; traced new-pp4-int2 /tmp/t4 105
  run new-7.5b-pp4-1f1b $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 4
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  finish
fi

if [[ "${SUITE:-record}" == "flags" ]]; then
  # XLA command-buffer variants of the pipelined step, then the best one on the other layouts.
  CB="--xla_gpu_enable_command_buffer"
  run 1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/capture_step.py $B13 --mesh 1,1,1 train.micro_batch_size=8
  run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
  run pp4-1f1b-default $ours $B13 --mesh 1,4,1 train.micro_batch_size=1
  run pp4-1f1b-cb-coll env XLA_FLAGS="$CB=+COLLECTIVES" python3 benchmarks/capture_step.py $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/flags_trace
  cp "$(newest_trace /tmp/flags_trace)" "$out/trace_pp4_1f1b_flags.json.gz" 2>/dev/null
  best=""; bt=9; for v in default cb-coll cb-coll-while; do
    t=$(step_of "pp4-1f1b-$v"); [[ -n "$t" ]] && python3 -c "import sys; sys.exit(0 if $t < $bt else 1)" && { best=$v; bt=$t; }
  done
  case $best in cb-coll) export XLA_FLAGS="$CB=+COLLECTIVES";; cb-coll-while) export XLA_FLAGS="$CB=+COLLECTIVES,+WHILE";; esac
  echo "best: ${best:-none} ($bt s) XLA_FLAGS=${XLA_FLAGS:-}" | tee -a "$out/record.log"
  run pp4-int2-best $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=interleaved parallel.virtual_stages=2
  run pp2tp2-1f1b-best $ours $B13 --mesh 1,2,2 train.micro_batch_size=1
  run 7.5b-pp4-1f1b-best $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 4
  run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
  finish
fi

run 1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/capture_step.py $B13 --mesh 1,1,1 train.micro_batch_size=8
run pp4-1f1b-m16-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/record_trace
cp "$(newest_trace /tmp/record_trace)" "$out/trace_pp4_1f1b.json.gz" 2>/dev/null
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run pp4-int2-m16-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=interleaved parallel.virtual_stages=2
run 7.5b-pp4-1f1b-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 4
run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
run pp4-1f1b-m8-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 train.global_batch_size=8
run pp4-1f1b-m32-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 train.global_batch_size=32
run 7.5b-pp4-int3-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=interleaved parallel.virtual_stages=3 --steps 4
run pp4-int2-m16-sel-auto $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=interleaved parallel.virtual_stages=2 parallel.stage_layers=auto
run pp4-1f1b-m16-none $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 train.recompute=none
run pp2tp2-1f1b-m16-sel $ours $B13 --mesh 1,2,2 train.micro_batch_size=1
# data parallelism over 4 GPUs: the state replicated, then split by parallel.zero (issue 10)
run dp4-zero0-m4-sel $ours $B13 --mesh 4,1,1 train.micro_batch_size=1
run dp4-zero1-m4-sel $ours $B13 --mesh 4,1,1 train.micro_batch_size=1 parallel.zero=1
run dp4-zero3-m4-sel $ours $B13 --mesh 4,1,1 train.micro_batch_size=1 parallel.zero=3
run dp2pp2-zero1-1f1b-sel $ours $B13 --mesh 2,2,1 train.micro_batch_size=1 parallel.zero=1
echo "=== done in $(( $(date +%s) - start ))s" | tee -a "$out/record.log"
