# Sourced by benchmarks/record_suite.sh (SUITE=tp2), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
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
