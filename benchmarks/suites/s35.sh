# Sourced by benchmarks/record_suite.sh (SUITE=s35, S35_PART=a|b). 4 GPUs (ask for
# nvidia-h100-x4), ~480 s a part. Prepared in session 34 (whose four calls all got 4x H200).
# Part a: issue 11 target 2's three layouts and issue 10 target 1 in one call, with the
# defaults of session 34 (the tensor ring's sends direct): the one-GPU baseline; (4,1,1) zero 2;
# (1,1,4) SP micro 16; (2,1,2) SP micro 8 bf16, zero 0 and zero 2 (with the tensor ring, never
# measured: its gradients reduce-scattered layer by layer in the backward instead of one
# all-reduce after it); (1,2,2) SP zb-phased v 4 micro 8 selective (ptdp-plan's pick).
# Part b: the 7.5B (1,1,4) SP micro 8 with the ring forced on (m 4, direct sends now), (4,1,1)
# zero 2 for the drift, and XLA's dynamic-slice fusion on (1,1,4) (session 34 part b, not run);
# (1,1,4) without the ring, for the planner's ring share (plan.cost.tp_ring_share, fitted before
# rank_plus and the direct sends: it now over-prices the ring, 1.10-1.12x on 4x H200).
# Part c (session 35, after part a): the token lookup reading the table's ZeRO shard and the
# first layer's gather behind a barrier (zero.shard_lookup, zero._gather_unrolled) on issue 10's
# (4,1,1) zero 2, A/B/A/B against the previous commit's package carried as .old/ptdp_jax, the
# one-GPU baseline first and a traced run of the new step last.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
T122B="$B13 --mesh 1,2,2 parallel.sequence_parallel=true parallel.schedule=zb-phased train.micro_batch_size=8 parallel.virtual_stages=4 train.recompute=selective"
case "${S35_PART:-a}" in
a) one_gpu
   run dp4-zero2 $ours $DP4A --steps 10
   run tp4-sp-mb16 $ours $TP4A --steps 8
   run tp212-sp-mb8 $ours $TP212A --steps 8
   run tp212-sp-mb8-zero2 $ours $TP212A parallel.zero=2 --steps 8
   run pp2tp2-zb-v4-mb8 $ours $T122B --steps 6
   run dp4-zero2-b $ours $DP4A --steps 10 ;;
b) run 7.5b-tp4-sp-mb8-ring $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.tp_comm_overlap=true --steps 4
   run dp4-zero2 $ours $DP4A --steps 10
   run tp4-sp-mb16 $ours $TP4A --steps 8
   run tp4-sp-mb16-dsf env XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $ours $TP4A --steps 8
   run tp4-sp-mb16-plain $ours $TP4A parallel.tp_comm_overlap=false --steps 8 ;;
c) one_gpu
   OLD="env PYTHONPATH=.old:."
   run dp4-zero2-old $OLD $ours $DP4A --steps 10
   run dp4-zero2 $ours $DP4A --steps 10
   run dp4-zero2-old-b $OLD $ours $DP4A --steps 10
   run dp4-zero2-b $ours $DP4A --steps 10
   run dp4-zero2-traced $ours $DP4A --steps 6 --trace-dir /tmp/tr_dp4 --trace-steps 2
   profiled dp4-zero2-traced /tmp/tr_dp4 $DP4A ;;
d) # XLA's command buffers off (the host waits before each update?), and the barrier alone
   # (.bar: this package with zero.shard_table off) against it and .old (previous commit)
   NOCB="env XLA_FLAGS=--xla_gpu_enable_command_buffer="
   one_gpu
   run 1gpu-none-mb8-nocb $NOCB CUDA_VISIBLE_DEVICES=0 $ONE_GPU
   run dp4-zero2 $ours $DP4A --steps 10
   run dp4-zero2-nocb $NOCB $ours $DP4A --steps 10
   run dp4-zero2-bar env PYTHONPATH=.bar:. $ours $DP4A --steps 10
   run dp4-zero2-old env PYTHONPATH=.old:. $ours $DP4A --steps 10
   run dp4-zero2-b $ours $DP4A --steps 10
   run dp4-zero2-nocb-b $NOCB $ours $DP4A --steps 10 ;;
e) # the one-GPU baseline on each of the four GPUs at once (record_suite.sh one_gpu_each),
   # then issue 10's and 11's 4-GPU cases against them
   one_gpu_each
   run dp4-zero2 $ours $DP4A --steps 10
   run tp212-sp-mb8 $ours $TP212A --steps 8
   run dp4-zero2-b $ours $DP4A --steps 10 ;;
g) # the tensor ring inside the pipeline (session 35: schedules without W ops), on (1,2,2)
   P122="$B13 --mesh 1,2,2 parallel.sequence_parallel=true parallel.schedule=1f1b-phased train.micro_batch_size=8 parallel.virtual_stages=4 train.recompute=selective"
   run pp2tp2-ph-v4-mb8-ring $ours $P122 parallel.tp_comm_overlap=true --steps 5
   run pp2tp2-ph-v4-mb8 $ours $P122 --steps 5
   run pp2tp2-zb-v4-mb8 $ours $T122B --steps 5 ;;
esac
