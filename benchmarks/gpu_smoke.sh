#!/usr/bin/env bash
# A user's path on one GPU with a real-size model, the way the README says: train with
# evaluations and checkpoints, resume past them, evaluate, generate, export. Run it on the GPU
# machine whenever a change touches the step, the loop, memory or checkpoints; its summary goes
# into the dated report.
#
#   bash benchmarks/gpu_smoke.sh [OUTDIR]       # default /tmp/ptdp-smoke
#   MODEL="configs/llama3-8b.yaml model.num_layers=4" bash benchmarks/gpu_smoke.sh
#   STEPS=12 bash benchmarks/gpu_smoke.sh       # the first run's steps; the resume adds half
#
# No layout keys: the planner picks the layout and the memory fraction is the commands' own
# (nothing exported). Each stage prints its exit code; the summary prints, per run, the
# planned memory beside the peak measured (metrics.jsonl), the step times around evaluations
# and checkpoints, and the checkpoints on disk. Exits 1 if any stage failed.
set -u
out=${1:-/tmp/ptdp-smoke}
MODEL=${MODEL-configs/llama3-8b.yaml model.num_layers=4}
SHAPE=${SHAPE-model.seq_len=4096 train.global_batch_size=8}
STEPS=${STEPS:-12}
rm -rf "$out"; mkdir -p "$out"
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
if command -v ptdp-train >/dev/null; then cmd() { "ptdp-$1" "${@:2}"; }
else cmd() { local c=${1//-/_}; python3 -m "ptdp_jax.cli.$c" "${@:2}"; }; fi
failed=0
stage() {   # stage NAME COMMAND...: run it, log to OUTDIR/NAME.log, print its exit code and time
  local name=$1 t0=$SECONDS rc; shift
  "$@" > "$out/$name.log" 2>&1; rc=$?
  echo "=== $name: exit $rc in $((SECONDS - t0)) s"
  grep -E "planner|predicted|resumed|done:|error|out of device memory|val loss|wrote|loss" \
    "$out/$name.log" | grep -v "^step " | tail -6
  (( rc == 0 )) || failed=1
}
half=$((STEPS / 2))
common=($MODEL $SHAPE train.warmup_steps=2 train.eval_every=$half checkpoint.dir=$out/ck
        checkpoint.every=$half checkpoint.keep=1 run.dir=$out/run train.log_every=1)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -1
df -h "$out" | tail -1
stage train cmd train "${common[@]}" train.steps=$STEPS
stage resume cmd train "${common[@]}" train.steps=$((STEPS + half)) train.sample_tokens=16
stage eval cmd eval "$out/ck" train.eval_batches=2
stage generate cmd generate "$out/ck" --prompt "The " --max-new-tokens 16
stage export cmd export "$out/ck" "$out/hf" --dtype bfloat16
python3 - "$out" <<'EOF'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = [json.loads(l) for l in open(out / "run/metrics.jsonl")]
plan = re.findall(r"([0-9.]+) GiB a device", (out / "train.log").read_text())
print(f"planned {plan[0] if plan else '?'} GiB a device; peak measured "
      f"{max(r.get('peak_mem_gib', 0) for r in rows):.1f} GiB")
for r in rows:
    extra = " ".join(f"{k} {r[k]:.1f}" for k in ("eval_s", "checkpoint_s") if k in r)
    print(f"  step {r['step']:>3}  {r['step_time_s']:.4f} s  mfu {r.get('mfu', 0):.3f}  "
          f"loss {r['loss']:.4f}  {extra}")
print("checkpoints:", sorted(p.name for p in (out / "ck").iterdir()))
EOF
exit $failed
