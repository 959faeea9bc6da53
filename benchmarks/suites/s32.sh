# Sourced by benchmarks/record_suite.sh (SUITE=s32, S32_PART=a|b|c|d|e|f). 4 GPUs, ~400 s a part.
# Session 32. Part a (issue 10 target 1): parallel.zero_ring (ZeRO's all-gathers and
# reduce-scatters over 'data' as rings of permutes, on the copy engines in XLA's peer mode)
# against NCCL's collectives on (4,1,1) zero 2 micro 4, A/B/A/B, then the ring traced.
# Part b (issue 11 target 2): (2,1,2) SP micro 8 with zero 2 and the ring against zero 0, the
# (4,1,1) zero 2 baseline of the same call, and a trace of the (1,1,4) SP micro 16 ring step.
# Part c: the ZeRO ring with shards sent straight; d: XLA's dynamic-slice fusion on the tensor
# ring. Part e (for the next lease): the tensor ring with direct sends
# (parallel.tp_overlap_sends=direct), in the probe and the (1,1,4) step, A/B/A/B. Part f:
# XLA's overlap limit of async collectives (default 1) at 4 on (4,1,1) zero 2 and (2,1,2).
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
case "${S32_PART:-a}" in
a) one_gpu
   run dp4-zero2 $ours $DP4A --steps 10
   run dp4-zero2-ring $ours $DP4A parallel.zero_ring=true --steps 10
   run dp4-zero2-b $ours $DP4A --steps 10
   run dp4-zero2-ring-b $ours $DP4A parallel.zero_ring=true --steps 10
   run dp4-zero2-ring-traced $ours $DP4A parallel.zero_ring=true --trace-dir /tmp/tr_zr --trace-steps 2
   profiled dp4-zero2-ring-traced /tmp/tr_zr $DP4A parallel.zero_ring=true ;;
b) one_gpu
   run dp4-zero2 $ours $DP4A --steps 10
   run dp4-zero2-ring $ours $DP4A parallel.zero_ring=true --steps 10
   run tp212-sp-mb8-auto $ours $TP212A --steps 8
   run tp212-sp-mb8-zero2-ring $ours $TP212A parallel.zero=2 parallel.zero_ring=true --steps 8
   run tp4-sp-mb16-auto-traced $ours $TP4A --steps 8 --trace-dir /tmp/tr_t4 --trace-steps 2
   profiled tp4-sp-mb16-auto-traced /tmp/tr_t4 $TP4A ;;
c) one_gpu     # the ring's permutes sent straight (shift k = 1 .. d - 1), no chain
   run dp4-zero2 $ours $DP4A --steps 10
   run dp4-zero2-direct $ours $DP4A parallel.zero_ring=true --steps 10
   run dp4-zero2-b $ours $DP4A --steps 10
   run dp4-zero2-direct-b $ours $DP4A parallel.zero_ring=true --steps 10
   run tp4-sp-mb16-auto-traced $ours $TP4A --steps 8 --trace-dir /tmp/tr_t4 --trace-steps 2
   profiled tp4-sp-mb16-auto-traced /tmp/tr_t4 $TP4A
   run dp4-zero2-direct-traced $ours $DP4A parallel.zero_ring=true --trace-dir /tmp/tr_zd --trace-steps 2
   profiled dp4-zero2-direct-traced /tmp/tr_zd $DP4A parallel.zero_ring=true ;;
d) DSF="--xla_gpu_enable_dynamic_slice_fusion=true"   # the ring's block slices as GEMM operand offsets
   run tp4-sp-mb16-auto $ours $TP4A --steps 8
   run tp4-sp-mb16-auto-dsf env XLA_FLAGS=$DSF $ours $TP4A --steps 8
   run tp4-sp-mb16-auto-b $ours $TP4A --steps 8
   run tp4-sp-mb16-auto-dsf-b env XLA_FLAGS=$DSF $ours $TP4A --steps 8
   run tp212-sp-mb8-auto $ours $TP212A --steps 8
   run tp212-sp-mb8-auto-dsf env XLA_FLAGS=$DSF $ours $TP212A --steps 8
   run tp4-sp-mb16-auto-dsf-traced env XLA_FLAGS=$DSF $ours $TP4A --steps 8 --trace-dir /tmp/tr_d4 --trace-steps 2
   profiled tp4-sp-mb16-auto-dsf-traced /tmp/tr_d4 $TP4A ;;
e) PEERF="--xla_gpu_collective_permute_mode=peer"   # the probe sets no compiler option itself
   probe peer XLA_FLAGS="$PEERF"
   one_gpu
   run tp4-sp-mb16-ring $ours $TP4A --steps 8
   run tp4-sp-mb16-direct $ours $TP4A parallel.tp_overlap_sends=direct --steps 8
   run tp4-sp-mb16-ring-b $ours $TP4A --steps 8
   run tp4-sp-mb16-direct-b $ours $TP4A parallel.tp_overlap_sends=direct --steps 8
   run tp4-sp-mb16-direct-lim4 env XLA_FLAGS=$LIM4 $ours $TP4A parallel.tp_overlap_sends=direct --steps 8
   run tp4-sp-mb16-ring-lim4 env XLA_FLAGS=$LIM4 $ours $TP4A --steps 8
   run tp4-sp-mb16-plain $ours $TP4A parallel.tp_comm_overlap=false --steps 8   # the loss reference
   probe peer-lim4 XLA_FLAGS="$PEERF $LIM4" ;;
f) one_gpu     # issue 10 and (2,1,2)
   run dp4-zero2 $ours $DP4A --steps 10
   run dp4-zero2-lim4 env XLA_FLAGS=$LIM4 $ours $DP4A --steps 10
   run dp4-zero2-b $ours $DP4A --steps 10
   run dp4-zero2-lim4-b env XLA_FLAGS=$LIM4 $ours $DP4A --steps 10
   run tp212-sp-mb8-auto $ours $TP212A --steps 8
   run tp212-sp-mb8-auto-lim4 env XLA_FLAGS=$LIM4 $ours $TP212A --steps 8
   run tp212-sp-mb8-auto-zero2 $ours $TP212A parallel.zero=2 --steps 8 ;;
esac
