#!/usr/bin/env bash
# Run a list of benchmark cases, one process each (memory freed between runs).
# Usage: benchmarks/run_suite.sh OUTFILE 'CONFIG [--mesh d,p,t] [key=value ...]' ...
# Each case prints one JSON line (benchmarks/bench_train.py); failures are recorded too.
set -u
out=$1; shift
export PYTHONPATH=${PYTHONPATH:-.}:.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.92}
for case in "$@"; do
  echo "=== $case" | tee -a "$out.log"
  # shellcheck disable=SC2086
  if line=$(python benchmarks/bench_train.py $case 2>>"$out.log" | tail -n 1); then
    echo "$line" | tee -a "$out"
  else
    echo "{\"case\": \"$case\", \"error\": \"failed, see log\"}" | tee -a "$out"
    tail -n 5 "$out.log"
  fi
done
