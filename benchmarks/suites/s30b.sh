# Sourced by benchmarks/record_suite.sh (SUITE=s30b). 2 or 4 GPUs, ~200 s. Session 30, issue 11:
# do NCCL 2.28's CTA policies let an all-gather run beside an independent GEMM chain
# (benchmarks/side_probe.py)? Sessions 25-26 found the gather's kernel waits for the GEMM's SMs.
# XLA's flags that name symmetric buffers, CTAs or copy engines are listed first; the probe runs
# under NCCL's default, NCCL_CTA_POLICY=1 and 2, and 2 with XLA's symmetric buffers (if the flag
# exists), NCCL's INFO lines about policies, windows and copy engines kept. NVLink multicast
# stays off (record_suite.sh exports NCCL_NVLS_ENABLE=0; KINDS.md).
so=$(python3 -c 'import glob, jax_plugins, os; print(" ".join(glob.glob(os.path.dirname(jax_plugins.__path__[0]) + "/jax_plugins/*/*.so")))' 2>/dev/null)
for f in $so; do strings "$f" | grep -oE "xla_gpu_[a-z0-9_]*(symmetric|cta|copy_engine|nccl)[a-z0-9_]*"; done | sort -u > "$out/xla_flags.txt"
SYM=$(grep -m1 -E "^xla_gpu_(experimental_)?enable_nccl_symmetric_buffers$" "$out/xla_flags.txt")
probe() {   # probe TAG [ENV...]: side_probe under the environment, NCCL's notes grepped
  local tag=$1; shift
  echo "=== $tag: $*" | tee -a "$out/probe.log"
  env "$@" NCCL_DEBUG=INFO timeout 120 python3 benchmarks/side_probe.py 2> "/tmp/nccl_$tag.log" \
    | tee -a "$out/probe.jsonl"
  grep -iE "cta|copy engine|CE |symmetric|window|register|policy|error|warn" "/tmp/nccl_$tag.log" \
    | sort | uniq -c | sort -rn | head -25 >> "$out/probe.log"
  tail -3 "/tmp/nccl_$tag.log" >> "$out/probe.log"
}
probe default
probe cta1 NCCL_CTA_POLICY=1
probe cta2 NCCL_CTA_POLICY=2
[[ -n "$SYM" ]] && probe cta2-sym NCCL_CTA_POLICY=2 XLA_FLAGS="--$SYM=true"
[[ -n "$SYM" ]] && probe sym XLA_FLAGS="--$SYM=true"
