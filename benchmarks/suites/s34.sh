# Sourced by benchmarks/record_suite.sh (SUITE=s34, S34_PART=a|b|c|d|e|f). 4 GPUs (ask for
# nvidia-h100-x4), ~480 s a part. Prepared in session 33 for the next 4-GPU lease.
# Part a: issue 11 target 2 on H100 after sharding.rank_plus (session 33: -2.6% on 4x H200,
# 40.4-40.6% MFU there): (1,1,4) SP micro 16 under auto (the ring), with direct sends, and
# direct sends with XLA's overlap limit 4 (session 32: -2.3% on H200, loss question settled on
# (1,1,2) in session 33); (2,1,2) SP micro 8 bf16 against (4,1,1) zero 2 of the same call;
# the one-GPU baseline.
# Part b: the 7.5B (1,1,4) SP micro 8 with the ring forced on (m 4) after rank_plus, and
# (4,1,1) zero 2 again (issue 10 target 1, A/B drift); XLA's dynamic-slice fusion again, now
# that each ring block is one plain slice (session 32 part d: nothing, with duplicated slices).
# Added in session 34 (each call got 4x H200): c, direct + limit 4 again and on (2,1,2); d,
# direct against the ring A/B/A and ptdp-plan's two best (1,2,2) layouts; e, (1,2,2) zb-phased
# micro 8 variants; f, the planner's (1,2,2) pick traced. Part b was not run (see s35 b).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
case "${S34_PART:-a}" in
a) one_gpu
   run tp4-sp-mb16-auto $ours $TP4A --steps 8
   run tp4-sp-mb16-direct $ours $TP4A parallel.tp_overlap_sends=direct --steps 8
   run tp4-sp-mb16-direct-lim4 env XLA_FLAGS=$LIM4 $ours $TP4A parallel.tp_overlap_sends=direct --steps 8
   run dp4-zero2 $ours $DP4A --steps 10
   run tp212-sp-mb8-auto $ours $TP212A --steps 8 ;;
b) run 7.5b-tp4-sp-mb8-ring $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.tp_comm_overlap=true --steps 4
   run dp4-zero2 $ours $DP4A --steps 10
   run tp4-sp-mb16-auto-b $ours $TP4A --steps 8
   run tp4-sp-mb16-dsf env XLA_FLAGS=--xla_gpu_enable_dynamic_slice_fusion=true $ours $TP4A --steps 8 ;;
c) run tp4-sp-mb16-direct-lim4-b env XLA_FLAGS=$LIM4 $ours $TP4A parallel.tp_overlap_sends=direct --steps 8
   run tp212-sp-mb8-direct-lim4 env XLA_FLAGS=$LIM4 $ours $TP212A parallel.tp_overlap_sends=direct --steps 8
   run dp4-zero2 $ours $DP4A --steps 10
   run tp212-sp-mb8-auto-b $ours $TP212A --steps 8
   run tp4-sp-mb16-auto-c $ours $TP4A --steps 8 ;;
d) T122P="$B13 --mesh 1,2,2 parallel.sequence_parallel=true parallel.schedule=zb-phased train.recompute=selective"
   run tp4-sp-mb16-direct-d $ours $TP4A parallel.tp_overlap_sends=direct --steps 8
   run tp4-sp-mb16-ring-d $ours $TP4A parallel.tp_overlap_sends=ring --steps 8
   run dp4-zero2 $ours $DP4A --steps 10
   run pp2tp2-zb-v4-mb8 $ours $T122P train.micro_batch_size=8 parallel.virtual_stages=4 --steps 6
   run pp2tp2-zb-v3-mb4 $ours $T122P train.micro_batch_size=4 parallel.virtual_stages=3 --steps 6
   run tp4-sp-mb16-direct-d2 $ours $TP4A parallel.tp_overlap_sends=direct --steps 8 ;;
e) T122P="$B13 --mesh 1,2,2 parallel.sequence_parallel=true parallel.schedule=zb-phased train.micro_batch_size=8"
   run dp4-zero2 $ours $DP4A --steps 10
   run pp2tp2-zb-v4-mb8-b $ours $T122P parallel.virtual_stages=4 train.recompute=selective --steps 8
   run pp2tp2-zb-v4-mb8-none $ours $T122P parallel.virtual_stages=4 train.recompute=none --steps 8
   run pp2tp2-zb-v2-mb8 $ours $T122P parallel.virtual_stages=2 train.recompute=selective --steps 8 ;;
f) # where the (1,2,2) step's time goes: the planner's pick traced, against the one-GPU share
   T122B="$B13 --mesh 1,2,2 parallel.sequence_parallel=true parallel.schedule=zb-phased train.micro_batch_size=8 parallel.virtual_stages=4 train.recompute=selective"
   one_gpu
   run pp2tp2-zb-v4-mb8-traced $ours $T122B --steps 6 --trace-dir /tmp/tr_122 --trace-steps 2
   profiled pp2tp2-zb-v4-mb8-traced /tmp/tr_122 $T122B ;;
esac
