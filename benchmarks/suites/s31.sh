# Sourced by benchmarks/record_suite.sh (SUITE=s31). 4 GPUs, ~420 s. Session 31, issue 11: XLA's
# (run before tp_comm_overlap=auto: its plain cases now say tp_comm_overlap=false, as they ran)
# --xla_gpu_use_memcpy_local_p2p runs a collective-permute between GPUs of one process as a
# cudaMemcpy on the copy engines (peer pointers exchanged once; no NCCL kernel, no SMs). Sessions
# 13-15 found the tp_comm_overlap ring's NCCL permutes waiting for the GEMMs' SMs (+46% at t = 4,
# micro 16); sessions 25 and 30 found the same for NCCL's all-gathers. Part a: the overlap probe
# (1.3B MLP chain at micro 16, 32768 rows) with NCCL's permutes and with the copy engines, then
# one GPU, and the 1.3B (1,1,4) SP micro 16 step plain and with the ring on the copy engines.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
MEMF="--xla_gpu_use_memcpy_local_p2p=true"
so=$(python3 -c 'import glob, jax_plugins, os; print(" ".join(glob.glob(os.path.dirname(jax_plugins.__path__[0]) + "/jax_plugins/*/*.so")))' 2>/dev/null)
for f in $so; do strings "$f" | grep -oE "xla_gpu_[a-z0-9_]*(p2p|memcpy|copy_engine)[a-z0-9_]*"; done | sort -u > "$out/xla_flags.txt"
cat "$out/xla_flags.txt"
probe nccl
probe memcpy XLA_FLAGS="$MEMF"
one_gpu
TP4=$TP4_MB16
run tp4-sp-mb16 $TP4 parallel.tp_comm_overlap=false
run tp4-sp-mb16-ring-memcpy env XLA_FLAGS="$MEMF" $TP4 parallel.tp_comm_overlap=true
run tp4-sp-mb16-ring $TP4 parallel.tp_comm_overlap=true
