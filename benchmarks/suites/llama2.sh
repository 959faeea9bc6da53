# Sourced by benchmarks/record_suite.sh (SUITE=llama2), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs: LLaMA-7B (8 layers) against BASE (carried: XLA's dot merger on), since the step
# now turns the merger off for every model (LLaMA's wq/wk/wv and w_gate/w_up share inputs).
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
L7="configs/llama-7b.yaml model.num_layers=8 train.global_batch_size=8 train.recompute=selective"
run base-llama-1gpu-sel-mb4 env CUDA_VISIBLE_DEVICES=0 $base $L7 --mesh 1,1,1 train.micro_batch_size=4
run new-llama-1gpu-sel-mb4 env CUDA_VISIBLE_DEVICES=0 $ours $L7 --mesh 1,1,1 train.micro_batch_size=4
run base-llama-pp2-phased $base $L7 --mesh 1,2,1 $PROF_PH
run new-llama-pp2-phased $ours $L7 --mesh 1,2,1 $PROF_PH
