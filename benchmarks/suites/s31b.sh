# Sourced by benchmarks/record_suite.sh (SUITE=s31b). 4 GPUs, ~480 s. Session 31, issues 11 and 10.
# (run before tp_comm_overlap=auto: its plain cases now say tp_comm_overlap=false, as they ran)
# Part a found --xla_gpu_use_memcpy_local_p2p inert in this XLA (jax 0.11.2): the collective-
# permute thunk now reads --xla_gpu_collective_permute_mode (private | symmetric | peer); `peer`
# runs a local permute as a cudaMemcpy D2D into the peer's buffer (copy engines, no NCCL kernel,
# no SMs). --xla_gpu_all_gather_mode takes the same values. Here: the overlap probe (micro-16
# rows) with NCCL's permutes and with peer mode; side_probe (all-gathers beside GEMMs) with the
# all-gather in peer mode; then the steps: one GPU, 1.3B (1,1,4) SP micro 16 plain and with the
# ring in peer mode, (4,1,1) zero 2 with its all-gathers in peer mode, (2,1,2) plain and ring.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
PEERF="--xla_gpu_collective_permute_mode=peer"
AGF="--xla_gpu_all_gather_mode=peer"
side() {   # side TAG [ENV...]: side_probe (8 all-gathers of 32 MiB beside a GEMM chain)
  local tag=$1; shift
  echo "=== side $tag: $* (t=$(( $(date +%s) - start ))s)" | tee -a "$out/record.log"
  env "$@" timeout 120 python3 benchmarks/side_probe.py 2>> "$out/record.log" \
    | sed "s/^{/{\"tag\": \"side-$tag\", /" | tee -a "$out/probe.jsonl"
}
probe nccl
probe peer XLA_FLAGS="$PEERF"
side nccl
side agpeer XLA_FLAGS="$AGF"
one_gpu
TP4=$TP4_MB16
run tp4-sp-mb16 $TP4 parallel.tp_comm_overlap=false
run tp4-sp-mb16-ring-peer env XLA_FLAGS="$PEERF" $TP4 parallel.tp_comm_overlap=true
DP4="$ours $B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2 --steps 10"
run dp4-zero2 $DP4
run dp4-zero2-agpeer env XLA_FLAGS="$AGF" $DP4
TP212="$ours $B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16 --steps 8"
run tp212-sp-mb8 $TP212 parallel.tp_comm_overlap=false
run tp212-sp-mb8-ring-peer env XLA_FLAGS="$PEERF" $TP212 parallel.tp_comm_overlap=true
