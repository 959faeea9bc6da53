#!/usr/bin/env bash
# The headline table (docs/performance.md) on the GPU machine: ptdp_jax's train() loop
# (benchmarks/bench_train.py) on the 1.3B GPT (one GPU, data 2, tensor 2, pipe 2) and on a
# LLaMA-7B shape with 8 layers (one GPU), beside MaxText and the PyTorch peer on the same cases
# when their folders are there. Measured on 2x H200; on one GPU the 2-GPU rows are skipped.
#
#   bash benchmarks/headline.sh [OUTDIR]           # OUTDIR: default $OUT, else /tmp/headline
#   ONLY='gpt-1gpu|llama' bash benchmarks/headline.sh  # the rows whose name matches (a regex)
#   PEERS=none bash benchmarks/headline.sh           # ptdp_jax only (also: torch, maxtext, all)
#
# Peers, never part of the tree: `.peer/torch_ptd.py` (torchrun from the image) and
# `.peer/maxtext/run_gpu.sh` with its wheels in `.whl-mtx/` (both at the checkout's root, as
# ../shared/peer/README.md says; on the lent machines carry them). Writes OUTDIR/headline.jsonl
# (each case's JSON line with "row" and "impl" added) and OUTDIR/headline.log, then prints the
# table. Step times are medians: bench_train.py's over steps 4-12 of train(), the peer's over
# 10 steps after 3 warm-up steps, MaxText's over steps 5-14.
set -u
out=${1:-${OUT:-/tmp/headline}}
mkdir -p "$out"
jsonl="$out/headline.jsonl"; log="$out/headline.log"
: > "$jsonl"
ONLY=${ONLY:-.}; PEERS=${PEERS:-all}; PY=${PY:-python3}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True}

ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 \
  | tee -a "$log"
$PY -c 'import jax; print("jax", jax.__version__)' 2>/dev/null | tee -a "$log"
# one GPU: micro 16 on a 141 GB card (78.7 GiB; 3% faster than micro 8 on H200), micro 8 on 80 GB
mb1=8; [[ ${mib:-0} -gt 100000 ]] && mb1=16

run() {   # run ROW IMPL GPUS COMMAND...: the command's last JSON line, tagged, to headline.jsonl
  local row=$1 impl=$2 gpus=$3 line; shift 3
  [[ $row =~ $ONLY ]] || return 0
  if (( ngpu < gpus )); then
    echo "=== $row ($impl): needs $gpus GPUs, $ngpu here" | tee -a "$log"; return 0
  fi
  echo "=== $row ($impl): $*" | tee -a "$log"
  line=$(timeout "${CASE_TIMEOUT:-600}" "$@" 2>>"$log" | grep '^{' | tail -n 1)
  tag "$row" "$impl" "$line" | tee -a "$jsonl" | cut -c1-200
}
tag() {   # tag ROW IMPL JSON: the JSON line with row and impl first, or an error line
  $PY -c 'import json, sys
try:
    rec = json.loads(sys.argv[3])
except ValueError:
    rec = {"error": "no result, see headline.log"}
rec = {k: v for k, v in rec.items() if k not in ("row", "impl")}   # the peer names its impl
print(json.dumps({"row": sys.argv[1], "impl": sys.argv[2], **rec}))' "$@"
}

B13=configs/bench-1.3b.yaml
L7="configs/llama-7b.yaml model.num_layers=8 train.global_batch_size=8"
ours="$PY benchmarks/bench_train.py --steps 12"
run gpt-1gpu ptdp_jax 1 env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1 \
  train.micro_batch_size=$mb1 train.recompute=none
run gpt-dp2 ptdp_jax 2 $ours $B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none \
  parallel.zero=2 parallel.grad_reduce_dtype=bfloat16
run gpt-tp2 ptdp_jax 2 $ours $B13 --mesh 1,1,2 train.micro_batch_size=16 train.recompute=none \
  parallel.sequence_parallel=true
run gpt-pp2 ptdp_jax 2 $ours $B13 --mesh 1,2,1 train.micro_batch_size=1 \
  train.recompute=selective parallel.schedule=zb-phased parallel.virtual_stages=2
run llama-1gpu ptdp_jax 1 env CUDA_VISIBLE_DEVICES=0 $ours $L7 --mesh 1,1,1 \
  train.micro_batch_size=8 train.recompute=selective

if [[ -f .peer/torch_ptd.py && $PEERS =~ ^(all|torch)$ ]]; then
  P13="--layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 51200 --global-batch 16"
  P13="$P13 --steps 10 --warmup 3 --dtype bf16"
  T2="torchrun --standalone --nproc-per-node 2 .peer/torch_ptd.py $P13"
  run gpt-dp2 torch 2 $T2 --dp 2 --pp 1 --tp 1 --micro-batch 8
  run gpt-tp2 torch 2 $T2 --dp 1 --pp 1 --tp 2 --micro-batch 8
  run gpt-pp2 torch 2 $T2 --dp 1 --pp 2 --tp 1 --schedule 1f1b --micro-batch 1
fi

if [[ -f .peer/maxtext/run_gpu.sh && $PEERS =~ ^(all|maxtext)$ ]]; then
  declare -A MTX=([gpt-1gpu]=a_mwc [llama-1gpu]=b [gpt-dp2]=c_fsdp [gpt-tp2]=c_tp [gpt-pp2]=c_pp)
  cases=""
  for row in gpt-1gpu llama-1gpu gpt-dp2 gpt-tp2 gpt-pp2; do
    [[ $row =~ $ONLY ]] && cases="$cases ${MTX[$row]}"
  done
  if [[ ! -d .whl-mtx ]]; then
    echo "=== maxtext: no .whl-mtx/ (see the peer's README); skipped" | tee -a "$log"
  elif [[ -n $cases ]]; then
    echo "=== maxtext:$cases" | tee -a "$log"
    # shellcheck disable=SC2086
    timeout "${MTX_TIMEOUT:-900}" bash .peer/maxtext/run_gpu.sh $cases 2>&1 | tee -a "$log" \
      | sed -n 's/^MTX_RESULT //p' > "$out/maxtext.jsonl"
    while read -r line; do
      c=$($PY -c 'import json, sys; print(json.loads(sys.argv[1]).get("case", ""))' "$line")
      for row in "${!MTX[@]}"; do
        [[ ${MTX[$row]} == "$c" ]] && tag "$row" maxtext "$line" >> "$jsonl"
      done
    done < "$out/maxtext.jsonl"
  fi
fi

$PY - "$jsonl" <<'EOF'
import json, sys
recs = [json.loads(line) for line in open(sys.argv[1])]
got = {(r["row"], r["impl"]): r for r in recs}
ROWS = [("gpt-1gpu", "GPT 1.3B, 16", "1 GPU"), ("gpt-dp2", "GPT 1.3B, 16", "data 2"),
        ("gpt-tp2", "GPT 1.3B, 16", "tensor 2"), ("gpt-pp2", "GPT 1.3B, 16", "pipe 2"),
        ("llama-1gpu", "LLaMA-7B shape, 8 layers, 8", "1 GPU")]

def cell(row, impl):
    r = got.get((row, impl))
    if r is None:
        return "-"
    if "step_time_s" not in r:
        return r.get("error") or r.get("skipped") or "failed"
    text = f"{r['step_time_s']:.4f}"
    if impl == "ptdp_jax":
        text += f" (micro {r['micro_batch']}, {r['recompute']}"
        text += f", {100 * r['mfu']:.1f}% MFU)" if r.get("mfu") else ")"
    return text

device = next((r["device"] for r in recs if r.get("device")), "?")
print(f"\n{device}, step s (median), global batch after the model\n")
print("| model, global batch | layout | ptdp_jax | MaxText | PyTorch peer | MaxText / ptdp_jax |")
print("|---|---|---|---|---|---|")
for row, model, layout in ROWS:
    ours, mtx = got.get((row, "ptdp_jax"), {}), got.get((row, "maxtext"), {})
    ratio = (f"{mtx['step_time_s'] / ours['step_time_s']:.2f}x"
             if "step_time_s" in ours and "step_time_s" in mtx else "-")
    print(f"| {model} | {layout} | {cell(row, 'ptdp_jax')} | {cell(row, 'maxtext')} | "
          f"{cell(row, 'torch')} | {ratio} |")
EOF
