# Sourced by benchmarks/record_suite.sh (SUITE=flags), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
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
