# Sourced by benchmarks/record_suite.sh (SUITE=s13b), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
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
