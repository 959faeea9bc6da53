# Sourced by benchmarks/record_suite.sh (SUITE=s13c), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
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
