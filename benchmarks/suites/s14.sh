# Sourced by benchmarks/record_suite.sh (SUITE=s14), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs, what session 13's short 4-GPU lease left (priority order; carry .peer for b):
# a: the one-GPU baseline; (1,4,1) 1f1b-phased traced over two steps, the second read (the
#    first was skewed by the profiler's start); the 7.5B interleaved v 3 (target 3's other
#    half); (4,1,1) zero 0 and zero 1 after the backward (issue 10 target 1); (1,1,4) with
#    sequence parallelism by rows and without, and with parallel.tp_comm_overlap, traced
#    (issue 11 target 2); the overlap probe with the dot merger off, t = 4 and t = 2.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200} TRACE_STEPS=2
PP="$B13 --mesh 1,4,1 train.micro_batch_size=1"
DP="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none"
TP="$B13 --mesh 1,1,4 train.micro_batch_size=4 train.recompute=none"
# Two calls: S14_PART=a (up to the probes), then S14_PART=b (the 7.5B cases and the flags).
if [[ "${S14_PART:-a}" == "a" ]]; then
one_gpu
og=$(step_of 1gpu-none-mb8)
run pp4-phased-sel $ours $PP parallel.schedule=1f1b-phased --trace-dir /tmp/s4 --trace-steps 2
prof pp4-phased-sel /tmp/s4 1,4,1 $PROF_PH ${og:+--one-gpu-step $og}
run 7.5b-pp4-int3-sel $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective parallel.schedule=interleaved parallel.virtual_stages=3 --steps 3
run dp4-zero0 $ours $DP
run dp4-zero1-after $ours $DP parallel.zero=1 parallel.overlap_grad_reduce=false
run tp4-sp-mb4 $ours $TP parallel.sequence_parallel=true
run tp4-mb4 $ours $TP
run tp4-sp-ov-mb4 $ours $TP parallel.sequence_parallel=true parallel.tp_comm_overlap=true --trace-dir /tmp/s5
prof tp4-sp-ov-mb4 /tmp/s5 1,1,4 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true parallel.tp_comm_overlap=true
python3 benchmarks/overlap_probe.py 2>&1 | grep '^{' | tee -a "$out/record.jsonl"
CUDA_VISIBLE_DEVICES=0,1 python3 benchmarks/overlap_probe.py 2>&1 | grep '^{' | tee -a "$out/record.jsonl"
finish
fi
run tp4-sp-ov-mb4 $ours $TP parallel.sequence_parallel=true parallel.tp_comm_overlap=true
# issue 11 target 1: the 7.5B at (1,1,4) without recomputation fits with sequence
# parallelism at micro 4 (estimate 43.4 GiB; without it 53.3), split by rows
T75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=4 train.recompute=none parallel.sequence_parallel=true --steps 3"
run 7.5b-tp4-sp-none-mb4 $ours $T75
run 7.5b-tp4-sp-ov-none-mb4 $ours $T75 parallel.tp_comm_overlap=true
run 7.5b-tp4-sel-mb2 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=2 train.recompute=selective --steps 3
# issue 10 target 2: the 7.5B (4,1,1) zero=3, layer scan (auto) against unrolled layers
Z75="$B75 --mesh 4,1,1 train.global_batch_size=32 train.micro_batch_size=1 parallel.zero=3 --steps 3"
run 7.5b-dp4-zero3-scan-sel $ours $Z75 train.recompute=selective
run 7.5b-dp4-zero3-unrolled-sel $ours $Z75 train.recompute=selective train.scan_layers=false
run 7.5b-dp4-zero3-unrolled-none $ours $Z75 train.recompute=none train.scan_layers=false
# flags, last: cuBLAS instead of Triton for the micro-1 GEMMs (2048^3 at ~650 TFLOP/s in
# Triton at p = 2); XLA combining zero=1's per-layer reduce-scatters into larger ones (fewer
# NCCL kernels under the backward's element-wise work, session 9)
run pp4-phased-sel-cublas env XLA_FLAGS=--xla_gpu_enable_triton_gemm=false $ours $PP parallel.schedule=1f1b-phased
run dp4-zero1-rs256 env XLA_FLAGS=--xla_gpu_reduce_scatter_combine_threshold_bytes=268435456 $ours $DP parallel.zero=1
run dp4-zero1 $ours $DP parallel.zero=1
