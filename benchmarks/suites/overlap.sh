# Sourced by benchmarks/record_suite.sh (SUITE=overlap), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# XLA flags for overlapping communication, each against its case without them (issues 10, 11).
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
WE="--xla_gpu_threshold_for_windowed_einsum_mib=0 --xla_gpu_multi_streamed_windowed_einsum=true"
AR="--xla_gpu_all_reduce_combine_threshold_bytes=67108864"
one_gpu
run dp4-zero0-none-mb4 $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none
run dp4-zero0-none-mb4-ar64m env XLA_FLAGS="$AR" $ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none
run 1.3b-tp4-sp-none-mb4 $ours $B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true
run 1.3b-tp4-sp-none-mb4-we env XLA_FLAGS="$WE" $ours $B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true
run 7.5b-tp4-sp-sel-we env XLA_FLAGS="$WE" $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective parallel.sequence_parallel=true --steps 3
run 7.5b-tp4-sel-we env XLA_FLAGS="$WE" $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective --steps 3
run 7.5b-tp4-sp-sel $ours $B75 --mesh 1,1,4 $L75 parallel.tensor=4 train.micro_batch_size=2 train.recompute=selective parallel.sequence_parallel=true --steps 3
