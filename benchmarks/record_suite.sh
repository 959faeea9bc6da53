#!/usr/bin/env bash
# The record run for benchmarks/RESULTS.md on the 4-GPU machine: our layouts, the one-GPU
# baseline and the PyTorch peer in one lease, with a deadline (cases past it are skipped).
#
#   bash benchmarks/record_suite.sh OUTDIR DEADLINE_S [PEER_DIR]
#   SUITE=NAME bash benchmarks/record_suite.sh ...    # another suite: benchmarks/suites/NAME.sh
#                                                     # (each file says what it runs and why)
#
# Writes OUTDIR/record.jsonl (one JSON line per case, tagged), OUTDIR/record.log (stderr of
# every case) and OUTDIR/trace_pp4_1f1b.json.gz (a traced step for benchmarks/profile_step.py).
# PEER_DIR: a copy of ../shared/peer (torch_ptd.py), carried to the machine; skipped if absent.
set -u
if [[ "${SUITE:-record}" != record && ! -f "benchmarks/suites/${SUITE}.sh" ]]; then
  echo "SUITE=$SUITE: no benchmarks/suites/$SUITE.sh; there are: $(cd benchmarks/suites && ls *.sh | sed 's/\.sh$//' | tr '\n' ' ')" >&2
  exit 2
fi
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
# the issue 10 / 11 cases of the 1.3B (none): (4,1,1) zero 2, (2,1,2) and (1,1,4) sequence
# parallel, their 2-GPU stand-ins (2,1,1) zero 2 and (1,1,2); XLA's overlap limit at 4
DP4A="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2"
TP212A="$B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16"
TP4A="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
DP2="$B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2"
TP2="$B13 --mesh 1,1,2 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
LIM4="--xla_gpu_experimental_parallel_collective_overlap_limit=4"

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
ONE_GPU="python3 benchmarks/capture_step.py $B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none"
one_gpu() {   # the one-GPU baseline of every ideal: 1.3B, micro 8, no recomputation
  run 1gpu-none-mb8 env CUDA_VISIBLE_DEVICES=0 $ONE_GPU
}
one_gpu_each() {   # one_gpu_each [MICRO]: the one-GPU baseline on every GPU of the host at once
  # (tags 1gpu-none-mbMICRO-gpuI; MICRO 8 by default): a layout over all of them runs at its
  # slowest GPU's pace, and their speeds differ by up to ~3% (session 35), so GPU 0's figure
  # alone is a draw. On H200 micro 16 is the faster baseline (session 37; no fit on H100)
  local i n mb=${1:-8}; n=$(nvidia-smi -L | wc -l)
  for (( i = 0; i < n; i++ )); do
    run 1gpu-none-mb$mb-gpu$i env CUDA_VISIBLE_DEVICES=$i $ONE_GPU train.micro_batch_size=$mb &
  done
  wait
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

probe() {   # probe TAG [ENV...]: overlap_probe.py at the 1.3B's micro-16 rows, each case traced,
  # under the environment; its lines tagged probe-TAG into OUTDIR/probe.jsonl
  local tag=$1; shift
  echo "=== probe $tag: $* (t=$(( $(date +%s) - start ))s)" | tee -a "$out/record.log"
  env "$@" timeout 150 python3 benchmarks/overlap_probe.py --rows 32768 --trace "/tmp/probe_$tag" \
    2>> "$out/record.log" | sed "s/^{/{\"tag\": \"probe-$tag\", /" | tee -a "$out/probe.jsonl"
  rm -rf "/tmp/probe_$tag"
}
TP4_MB16="$ours $B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true --steps 8"

# a suite of its own file: benchmarks/suites/NAME.sh, sourced here with the helpers above
if [[ "${SUITE:-record}" != record ]]; then
  source "benchmarks/suites/${SUITE}.sh"
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
