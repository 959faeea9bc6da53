# Sourced by benchmarks/record_suite.sh (SUITE=s23c), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs (session 23): where a pipelined step's compile time goes. The 7.5B zb-phased v 3's
# first step takes 256 s (4x H200), the 1.3B zb-phased v 2's 134 s, one GPU's ~35 s. The
# 1.3B (1,2,1) zb-phased v 2 compiled three ways (no compilation cache): the default, logged
# by XLA's phase timers (gpu_compiler); XLA's LLVM module compilation in parallel threads;
# and with the indexed stash; first the combine default checked (parallel.static_stash=false: on CPU the tiny v 3 table compiles in
# 3.7 s against 28.1 s with a stash buffer and a branch per slot) (~330 s).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
ZB2="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2 --steps 4"
PAR="--xla_gpu_enable_llvm_module_compilation_parallelism=true --xla_gpu_force_compilation_parallelism=32"
# first, the (2,1,1) zero 2 with the combine thresholds set by step.compiler_options (the
# default since 0ccc4fc): ~0.279 s expected (s23x2b with XLA_FLAGS: 0.2790 s; before 0.2870)
run dp2-zero2-bf16-mb8-default $ours $B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2 --steps 10
run pp2-zbphased-v2-timers env TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1 $ours $ZB2
grep -E "took|Time spent|RunHloPasses|RunBackend|CompileToTargetBinary|ptx|PTX" "$out/record.log" | grep -v "^===" | head -40 > "$out/compile_phases.txt"
# (jax 0.11.2: "Unknown flag in XLA_FLAGS", the flag is gone from XLA; the case fails)
run pp2-zbphased-v2-llvm-parallel env XLA_FLAGS="$PAR" $ours $ZB2
run pp2-zbphased-v2-indexed-stash $ours $ZB2 parallel.static_stash=false
