#!/usr/bin/env bash
# Run benchmark cases on the device machine, one process each, with a per-case
# timeout and an overall deadline (cases that would start after it are skipped).
# Usage: benchmarks/device_suite.sh OUTFILE CASE_TIMEOUT_S DEADLINE_S 'CONFIG [--mesh d,p,t] [key=value ...]' ...
# Writes JSON lines to OUTFILE, every case's stderr to OUTFILE.log, and for a failed
# case its last 30 log lines to OUTFILE.log and a JSON error line to OUTFILE.
set -u
out=$1; case_to=$2; deadline=$3; shift 3
export PYTHONPATH=${PYTHONPATH:-.}:.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
PY=${PY:-python3}
start=$(date +%s)
for case in "$@"; do
  now=$(date +%s)
  if (( now - start > deadline )); then
    echo "{\"case\": \"$case\", \"error\": \"skipped: deadline\"}" | tee -a "$out"; continue
  fi
  echo "=== $case  (t=$((now - start))s)" | tee -a "$out.log"
  tmp=$(mktemp)
  # shellcheck disable=SC2086
  timeout "$case_to" $PY benchmarks/bench_train.py $case >"$tmp.out" 2>"$tmp"
  rc=$?
  cat "$tmp" >>"$out.log"
  line=$(grep '^{' "$tmp.out" | tail -n 1)
  if [[ $rc -eq 0 && -n "$line" ]]; then
    echo "$line" | tee -a "$out"
  else
    echo "{\"case\": \"$case\", \"error\": \"rc=$rc, see log\"}" | tee -a "$out"
    { echo "--- last 30 lines (rc=$rc)"; tail -n 30 "$tmp"; tail -n 5 "$tmp.out"; } | tee -a "$out.log"
  fi
  rm -f "$tmp" "$tmp.out"
done
echo "=== done in $(( $(date +%s) - start ))s" | tee -a "$out.log"
