# Sourced by benchmarks/record_suite.sh (SUITE=s30c). 2 GPUs, ~330 s. Session 30, issue 11: part
# b's probe logged NCCL's copy-engine init with XLA's symmetric buffers and NCCL_CTA_POLICY=2,
# and the probe's all-gathers alone ran 15% faster. Here the 1.3B (1,1,2) sequence parallel,
# none, micro 8 step under NCCL's default, XLA's symmetric buffers, and both with policy 2,
# A/B/A (XLA keeps its symmetric buffers outside its own pool: the memory fraction is 0.8).
export CASE_TIMEOUT=${CASE_TIMEOUT:-150} XLA_PYTHON_CLIENT_MEM_FRACTION=0.8
T2="$ours $B13 --mesh 1,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true --steps 8"
SYMF="--xla_gpu_experimental_enable_nccl_symmetric_buffers=true"
run tp2-sp-mb8 $T2
run tp2-sp-mb8-sym env XLA_FLAGS="$SYMF" $T2
run tp2-sp-mb8-sym-cta2 env XLA_FLAGS="$SYMF" NCCL_CTA_POLICY=2 $T2
run tp2-sp-mb8-again $T2
