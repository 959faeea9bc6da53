# Sourced by benchmarks/record_suite.sh (SUITE=s23x2), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 2 GPUs (session 23, no 4-GPU kind lent after the first lease): issue 10 target 1 from the
# trace. (2,1,1) 1.3B, none, micro 8 (m 1), bf16 reduction: zero 0 0.2751 s, 0.958x the one-GPU
# rate; zero 2 +3.2% (session 22), where the update on half the state should save ~5 ms. At
# d = 4 zero 2 is 0.874x. Both traced (two steps each) against the same call's one GPU, to see
# which collectives of zero 2 are exposed and how long the update takes in each (~200 s).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
DP2="$B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
one_gpu
run dp2-zero2-bf16-mb8 $ours $DP2 parallel.zero=2 --trace-dir /tmp/tr_z2 --trace-steps 2
profiled dp2-zero2-bf16-mb8 /tmp/tr_z2 $DP2 parallel.zero=2
run dp2-zero0-bf16-mb8 $ours $DP2 --trace-dir /tmp/tr_z0 --trace-steps 2
profiled dp2-zero0-bf16-mb8 /tmp/tr_z0 $DP2
