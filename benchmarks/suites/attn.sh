# Sourced by benchmarks/record_suite.sh (SUITE=attn), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs, A/B against BASE (carried): selective recomputation keeping the flash attention's
# outputs instead of running its forward again; (1,2,1) 1f1b-phased traced, the optimized HLO
# of the new step (for hlo_copies.py --where), and the one-GPU selective step.
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
PP2="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased"
one_gpu
run base-pp2-phased-sel $base $PP2 --trace-dir /tmp/a1; prof base-pp2-phased-sel /tmp/a1 1,2,1 $PROF_PH
run new-pp2-phased-sel $ours $PP2 --trace-dir /tmp/a2 --hlo-dir /tmp/h2
prof new-pp2-phased-sel /tmp/a2 1,2,1 $PROF_PH
gzip -c /tmp/h2/step_after_optimizations.txt > "$out/hlo_pp2_phased.txt.gz" 2>/dev/null
S1="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=selective"
run base-1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 $base $S1
run new-1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $S1
