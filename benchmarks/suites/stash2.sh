# Sourced by benchmarks/record_suite.sh (SUITE=stash2), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
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
