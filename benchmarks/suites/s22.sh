# Sourced by benchmarks/record_suite.sh (SUITE=s22), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# 4 GPUs (carry .peer), written in session 21, revised in session 22 after the 2x H200 A/B
# (NOTES issue 8 section 24): issue 9 target 2 again with the new default (session 21, 4x
# H200: zb-phased v 3 micro 2 1.4674 s, 1.229x the peer; 1.25x needs the peer's step / 1.25).
#   train.keep_ffn_activation is now auto (on under selective): each case below runs it; the
#   A/B against false (the activation run again, the session-21 default) is in parts b and d;
#   uninitialised buffers (parallel.empty_buffers=true, -0.8 ms at pp2: inside the drift) at
#   the 7.5B, whose stash is ~5x the 1.3B's; parallel.overlap_p2p=true (nothing at pp2) on
#   the 1.3B.
# Part a (~310 s): one GPU, the 7.5B zb-phased v 3 micro 2 (12 steps), the peer. Part b
# (~460 s): the same 7.5B with keep_ffn_activation=false, then with empty_buffers. Part c
# (~400 s): the 1.3B zb-phased v 2 three ways (HLO copies counted). Part d (~400 s): the
# 1.3B plain 1f1b (issue 9 target 1) and zb-phased v 2 without keep_ffn_activation, NCCL
# channels up (cached programs), the (4,1,1) at zero 2 and 1 with a bf16 reduction. Part e
# (~250 s): issue 11 target 1 on H100 (46.8% MFU on H200 in s17; the p = 1 sums in the GEMM
# since: predicted -1 to -2%) and the 1.3B (1,1,4) micro 16 (target 2: 40%).
# Part f (session 23, ~480 s): part a's 7.5B compile (256 s) left no time for its peer; f runs the
# peer first, then the issue 8/9/10 cases of part d that matter most, in one call after a.
# Part g (~360 s): issue 9 target 2 with both executor keys on (section 25), the peer first;
# then (4,1,1) zero 2 with the collectives combined up to 512 MB (issue 10, session 23).
# Part h (~200 s): issue 10 target 1, (4,1,1) zero 2 and zero 0 traced: where 12 ms go.
# Part i (session 24, ~450 s): one GPU, the 1.3B pp4 1f1b and zb-phased v 2 with and without
# both executor keys (empty_buffers, overlap_p2p: -39 ms on the 7.5B in part g), then part h.
# Its 1f1b case with both keys was refused by validation (overlap_p2p is for the phased
# schedules), as run: kept so that the suite matches its record.
# Part j (~360 s, same lease as g): part g's 7.5B without the two keys (the A/B), then with them
# again (its program cached on that machine).
# Part k (~200 s): one GPU and (4,1,1) zero 2, timed with and without a wait per step, and
# traced 3 steps back to back: is the GPU idle between two steps (issue 10's 0.95x window)?
# Part l (~200 s): (4,1,1) zero 2 with the reduce-scatters' combine threshold (MiB) at 512 (the
# default), XLA's own, 64 and 128; k's trace: the combined reduce-scatters run after the backward.
# Part m (~130 s): one GPU, then zero 2 with the new default (reduce-scatters at 128) and at 512.
# Part n (written in session 24, not yet run; ~200 s): zero 2 with NCCL limited to 8 and 4
# channels (fewer SMs taken from the element-wise kernels beside the collectives), and eight
# steps traced back to back (every (4,1,1) run has one step in six ~15 ms slower).
# Part o (not yet run; ~150 s): issue 11 target 2, the 1.3B (1,1,4) SP micro 16 traced (never
# traced at t = 4: where its 63% goes).
# Part p (session 25, ~260 s): issue 11 target 2, parallel.batch_split (NOTES issue 11 Session
# 25): the 1.3B (1,1,4) SP micro 16 at k = 1, 2 (traced) and 4. Part q (~300 s): the 7.5B
# (1,1,4) SP micro 8 (target 1) at k = 1 and 2. Part r (~250 s): part p's k = 2 missed (the
# forward's collectives still wait between the chunks' GEMMs): its compiled HLO (the schedule),
# and k = 2 and k = 1 with XLA's latency-hiding scheduler named on. parallel.batch_split was
# slower everywhere and taken out again (448f542): parts p, q and r ran at 293ae56-513596e;
# on later trees validation refuses the key.
# Part s (~200 s): train()'s loop, dispatching ahead or waiting for every step
# (train.dispatch_ahead, NOTES issue 10 Session 25), timed by bench_train.py (train() itself):
# one GPU and (4,1,1) zero 2, each A/B in the same call (the second run's program cached).
# Part t (~60 s): part s's (4,1,1) A/B again with each step timed from the previous step's end
# in both loops (part s timed the waiting loop from each dispatch: its host time between steps
# went uncounted).
# Part u (session 26, ~450 s): NCCL user-buffer registration (XLA's
# --xla_gpu_enable_nccl_user_buffers, collective buffers from ncclMemAlloc in their own memory
# space, XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB): zero-copy ring collectives, fewer SMs and
# less HBM traffic beside the compute kernels (NOTES issue 10 and 11, Session 26), A/B on
# (4,1,1) zero 2 and (1,1,4) SP micro 16; then part t's loop A/B.
# Part v (session 26, ~300 s): issue 11 target 2's exposed collectives (68.6 ms a step, nothing
# beside them) at NCCL's own settings against more channels, larger buffers, more threads; the
# channel counts NCCL picks (NCCL_DEBUG=INFO, one run), and whether part u's user buffers were
# registered at all.
# Part w (session 26, ~400 s): part v's probe timed the host's dispatch with each collective
# (0.79 ms for 32 MiB a device); the probe now loops 20 all-gather + reduce-scatter pairs in
# one program. The probe under NCCL settings, then the (1,1,4) SP micro 16 step A/B/A/B with
# NCCL_MIN_NCHANNELS=32 (part v: -2.7 ms), and (4,1,1) zero 2 with it.
# Part x (session 26, ~300 s): part w's probe put 64 channels ahead of 32 (32 MiB a device:
# 0.355 against 0.371 and 0.386 ms at NCCL's 24); the (1,1,4) step at 64 and 32 against the
# default, and issue 11 target 1's 7.5B with and without 64.
# Part y (written in session 26, not yet run; ~300 s): one GPU; issue 11 target 2's other half,
# (2,1,2) and (1,2,2) with the 64-channel default against NCCL's own (parallel.nccl_channels=0);
# issue 10's (4,1,1) zero 2 with NCCL_CTA_POLICY=1 (NCCL 2.27+: fewer CTAs a collective, less
# taken from the kernels beside it; ignored by an NCCL that lacks it) against the default.
# Part z (session 27, ~450 s): issue 8 target 1's floor: the one GPU at micro 1 (m 16, the
# pipeline's micro batch and recompute) beside micro 8, and the 1.3B pp4 1f1b and zb-phased v 2
# in the same call (step against the micro-8 ideal and against the micro-1 one); issue 11
# target 2's (2,1,2) at zero 0 and 2, and zero 2 with the (4,1,1) combine thresholds.
# Part zz (session 27, ~250 s): part z's (2,1,2) zero 2 ran on whole weights (GSPMD gathered every
# weight over 'tensor' too; zero.Layout now gathers each device's block): zero 0 against zero 2
# and zero 2 with the combine thresholds again, and (4,1,1) zero 2 (the best without 'tensor').
# Part zy (session 27, ~300 s): zero 2 at p = 1 peaks as high as zero 0 ((4,1,1) 33.0 against
# 33.5 GiB; (2,1,1) 62.4 against 50.0) and its reduce-scatters all run at the end of the
# backward (s25 trace): XLA's scheduler keeps every full-size gradient to the end. Which of its
# flags this XLA has, then (4,1,1) and (2,1,2) zero 2 with more collectives in flight and with a
# lower memory limit for the latency-hiding scheduler. Part zy2 (~200 s, 2 GPUs: no 4-GPU kind
# was lent for zy): the same on (2,1,1) zero 2 micro 8 (62.4 against zero 0's 50.0 GiB, s23).
# Part zx (~180 s, 2 GPUs): zero 1 and 2 without recomputation no longer run each layer under a
# jax.checkpoint that saves everything (zy2's GPU HLO: the GeLU fusion wrote 5 (b, s, f) tensors
# a layer for the backward against zero 0's 2): (2,1,1) zero 2, zero 0, zero 1.
# Part zb (session 28, ~300 s, after za): (4,1,1) zero 2 with the all-gather combiner at 256
# and 128 MB (the step's first gather, 512 MB, runs with nothing beside it), A/B/A; then three
# steps traced back to back (where za's 0.94x leaves the rest).
# Part zc (session 28, ~220 s): the one GPU at micro 4 (the per-GPU work of (4,1,1) micro 4)
# against micro 8, timed by capture_step and through train(); (4,1,1) zero 2 through train().
# Part zh (session 28, ~420 s, for an H100 lease: issue 9 target 2 has only H200 figures): the
# peer's 7.5B pp4 1F1B, then ours zb-phased v 3 micro 2 (65.9 GiB on H200: fits at 0.92 of 80).
# Part e is issue 11 target 1 on H100.
# Part zi (session 29, ~150 s, for an H100 lease): issue 10 target 1 on H100 (0.909x, s29 part
# z): (4,1,1) zero 2 timed, then three steps traced back to back, read by NCCL kernel (what runs
# beside each collective), by idle gap and by kernel category: where H100's 5.5-6.7% over
# the no-communication step goes (NOTES issue 10, Session 29); then one GPU on (4,1,1)'s own
# batch (global 4, micro 4), traced the same way: the same kernels with nothing beside them.
# (Run once in session 29 before profile_step.py read back-to-back traces: both reads failed and
# the one-GPU trace was lost; profile_step.py --back-to-back now cuts them at 1 ms gaps.)
# Part za (written in session 27, not yet run; ~330 s): issue 10 target 1 with part zx's change
# on 4 GPUs (prediction: (4,1,1) zero 2 0.136-0.139 s, 0.94-0.96x): one GPU, zero 2 twice, zero
# 0 and 1, zero 2 through train() (bench_train.py), then issue 11 target 2's (2,1,2) at zero 2
# against zero 0 (zero 2 ran whole weights before part zz and a checkpoint wrapper before zx).
export CASE_TIMEOUT=${CASE_TIMEOUT:-330} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
ZB75="$B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 12 train.micro_batch_size=2 parallel.schedule=zb-phased parallel.virtual_stages=3"
ZB13="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2 --steps 10"
DP4="$B13 --mesh 4,1,1 train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
OV="parallel.overlap_p2p=true"; NOKEEP="train.keep_ffn_activation=false"
case "${S22_PART:-a}" in
a) one_gpu
   run 7.5b-pp4-zbphased-v3-mb2 $ours $ZB75
   run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75 ;;
b) run 7.5b-pp4-zbphased-v3-mb2-nokeep $ours $ZB75 $NOKEEP
   run 7.5b-pp4-zbphased-v3-mb2-emptybuf $ours $ZB75 parallel.empty_buffers=true ;;
c) run pp4-zbphased-v2-sel-emptybuf $ours $ZB13 parallel.empty_buffers=true --hlo-dir /tmp/h_new
   run pp4-zbphased-v2-sel $ours $ZB13 --hlo-dir /tmp/h_old
   run pp4-zbphased-v2-sel-overlap $ours $ZB13 $OV
   for d in new old; do [[ -f /tmp/h_$d/step_after_optimizations.txt ]] && python3 benchmarks/hlo_copies.py /tmp/h_$d/step_after_optimizations.txt --min-mb 1 --top 20 > "$out/copies_zbphased_v2_$d.md" 2>&1; done ;;
d) run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b
   run pp4-zbphased-v2-nokeep $ours $ZB13 $NOKEEP
   run pp4-zbphased-v2-again $ours $ZB13
   run pp4-zbphased-v2-p2pmin16 env NCCL_MIN_P2P_NCHANNELS=16 $ours $ZB13
   run dp4-zero0-bf16-mb4 $ours $DP4
   run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2
   run dp4-zero1-bf16-mb4 $ours $DP4 parallel.zero=1
   run dp4-zero0-bf16-mb4-minch32 env NCCL_MIN_NCHANNELS=32 $ours $DP4 ;;
p) one_gpu
   TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   run tp4-sp-mb16 $ours $TP4
   run tp4-sp-mb16-k2 $ours $TP4 parallel.batch_split=2 --trace-dir /tmp/tr_k2 --trace-steps 2
   profiled tp4-sp-mb16-k2 /tmp/tr_k2 $TP4 parallel.batch_split=2
   run tp4-sp-mb16-k4 $ours $TP4 parallel.batch_split=4 ;;
s) BT="python3 benchmarks/bench_train.py"
   G1="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none --steps 14"
   run 1gpu-ahead env CUDA_VISIBLE_DEVICES=0 $BT $G1
   run 1gpu-waited env CUDA_VISIBLE_DEVICES=0 $BT $G1 train.dispatch_ahead=false
   run dp4-zero2-ahead $BT $DP4 parallel.zero=2 --steps 30
   run dp4-zero2-waited $BT $DP4 parallel.zero=2 --steps 30 train.dispatch_ahead=false
   run dp4-zero2-ahead2 $BT $DP4 parallel.zero=2 --steps 30 ;;
t) BT="python3 benchmarks/bench_train.py"
   run dp4-zero2-waited $BT $DP4 parallel.zero=2 --steps 30 train.dispatch_ahead=false
   run dp4-zero2-ahead $BT $DP4 parallel.zero=2 --steps 30 ;;
r) TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   LHS="XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true"
   run tp4-sp-mb16-k2-hlo $ours $TP4 parallel.batch_split=2 --hlo-dir /tmp/hlo_k2
   gzip -c /tmp/hlo_k2/step_after_optimizations.txt > "$out/hlo_k2.txt.gz"
   run tp4-sp-mb16-k2-lhs env $LHS $ours $TP4 parallel.batch_split=2
   run tp4-sp-mb16-lhs env $LHS $ours $TP4 ;;
q) TP75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true"
   run 7.5b-tp4-sp-mb8-k2 $ours $TP75 parallel.batch_split=2 --steps 5
   run 7.5b-tp4-sp-mb8 $ours $TP75 --steps 5
   # part r's schedule puts chunk 1's gather beside chunk 0's GEMM, yet it runs after it:
   # the GEMM holds every SM when the gather's kernel arrives? NCCL's stream at top priority
   TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   run tp4-sp-mb16-k2-prio env XLA_FLAGS=--xla_gpu_enable_highest_priority_async_stream=true $ours $TP4 parallel.batch_split=2 ;;
e) run 7.5b-tp4-sp-mb8 $ours $B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 5
   run tp4-sp-mb16 $ours $B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true ;;
f) run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
   run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b
   run pp4-zbphased-v2-sel $ours $ZB13
   run dp4-zero0-bf16-mb4 $ours $DP4
   run pp4-zbphased-v2-nokeep $ours $ZB13 $NOKEEP
   run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2 ;;
g) run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
   run 7.5b-pp4-zbphased-v3-mb2-emptybuf-overlap $ours $ZB75 parallel.empty_buffers=true $OV --steps 8
   run dp4-zero2-bf16-mb4-combined $ours $DP4 parallel.zero=2 ;;
h) one_gpu
   run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2 --trace-dir /tmp/tr_z2 --trace-steps 2
   profiled dp4-zero2-bf16-mb4 /tmp/tr_z2 $DP4 parallel.zero=2
   run dp4-zero0-bf16-mb4 $ours $DP4 --trace-dir /tmp/tr_z0 --trace-steps 2
   profiled dp4-zero0-bf16-mb4 /tmp/tr_z0 $DP4 ;;
i) one_gpu
   run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b
   run pp4-zbphased-v2-sel $ours $ZB13
   run pp4-zbphased-v2-sel-emptybuf-overlap $ours $ZB13 parallel.empty_buffers=true $OV
   run pp4-1f1b-sel-emptybuf-overlap $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b parallel.empty_buffers=true $OV
   run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2 --trace-dir /tmp/tr_z2 --trace-steps 2
   profiled dp4-zero2-bf16-mb4 /tmp/tr_z2 $DP4 parallel.zero=2
   run dp4-zero0-bf16-mb4 $ours $DP4 --trace-dir /tmp/tr_z0 --trace-steps 2
   profiled dp4-zero0-bf16-mb4 /tmp/tr_z0 $DP4 ;;
j) run 7.5b-pp4-zbphased-v3-mb2 $ours $ZB75 --steps 8
   run 7.5b-pp4-zbphased-v3-mb2-emptybuf-overlap $ours $ZB75 parallel.empty_buffers=true $OV --steps 8 ;;
k) for t in 1gpu dp4; do
     if [[ $t == 1gpu ]]; then args="$B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none"; e="env CUDA_VISIBLE_DEVICES=0"
     else args="$DP4 parallel.zero=2"; e=""; fi
     run $t-b2b $e $ours $args --trace-dir /tmp/tr_$t --trace-steps 3 --back-to-back
     tr=$(newest_trace /tmp/tr_$t); [[ -n $tr ]] && cp "$tr" "$out/trace_$t-b2b.json.gz" &&
       python3 benchmarks/idle_gaps.py "$tr" --top 12 --min-us 200 > "$out/gaps_$t-b2b.md" 2>&1
   done ;;
l) for c in 512,512 512,0 512,64 512,128 0,0; do
     run dp4-zero2-combine-${c/,/-} $ours $DP4 parallel.zero=2 --combine-mib $c
   done ;;
m) one_gpu
   run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2
   run dp4-zero2-combine-512-512 $ours $DP4 parallel.zero=2 --combine-mib 512,512 ;;
n) one_gpu
   run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2 --steps 12
   for ch in 8 4; do run dp4-zero2-maxch$ch env NCCL_MAX_NCHANNELS=$ch $ours $DP4 parallel.zero=2 --steps 12; done
   run dp4-zero2-b2b8 $ours $DP4 parallel.zero=2 --trace-dir /tmp/tr_b8 --trace-steps 8 --back-to-back
   tr=$(newest_trace /tmp/tr_b8); [[ -n $tr ]] && cp "$tr" "$out/trace_dp4-zero2-b2b8.json.gz" ;;
o) one_gpu
   TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   run tp4-sp-mb16 $ours $TP4 --trace-dir /tmp/tr_tp4 --trace-steps 2
   profiled tp4-sp-mb16 /tmp/tr_tp4 $TP4 ;;
u) one_gpu
   UB="env XLA_FLAGS=--xla_gpu_enable_nccl_user_buffers=true XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB=${UB_MB:-8192} XLA_PYTHON_CLIENT_MEM_FRACTION=0.8"
   TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   run dp4-zero2-bf16-mb4 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-ub $UB $ours $DP4 parallel.zero=2 --steps 12
   run tp4-sp-mb16 $ours $TP4
   run tp4-sp-mb16-ub $UB $ours $TP4
   BT="python3 benchmarks/bench_train.py"
   run dp4-zero2-waited $BT $DP4 parallel.zero=2 --steps 30 train.dispatch_ahead=false
   run dp4-zero2-ahead $BT $DP4 parallel.zero=2 --steps 30 ;;
v) TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   for e in "" NCCL_MIN_NCHANNELS=32 NCCL_BUFFSIZE=16777216; do
     echo "# $e" >> "$out/collective_bw.txt"
     timeout 90 env $e python3 benchmarks/collective_bw.py --mib 8 32 128 >> "$out/collective_bw.txt" 2>>"$out/record.log"
   done
   run tp4-sp-mb16 $ours $TP4
   timeout 150 env NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING,REG NCCL_DEBUG_FILE=/tmp/nccl_info.txt $ours $TP4 --steps 2 > /dev/null 2>&1
   grep -i "channel\|nthreads\|regist\|buffsize\|tuner\|NCCL version" /tmp/nccl_info.txt* | sed "s/^.*NCCL INFO //" | sort | uniq -c | sort -rn | head -60 > "$out/nccl_info_tp4.txt"
   run tp4-sp-mb16-minch32 env NCCL_MIN_NCHANNELS=32 $ours $TP4
   run tp4-sp-mb16-buf16m env NCCL_BUFFSIZE=16777216 $ours $TP4
   run tp4-sp-mb16-nthr512 env NCCL_NTHREADS=512 $ours $TP4
   run tp4-sp-mb16-minch32-buf16m env NCCL_MIN_NCHANNELS=32 NCCL_BUFFSIZE=16777216 $ours $TP4
   UB="env XLA_FLAGS=--xla_gpu_enable_nccl_user_buffers=true XLA_PYTHON_CLIENT_COLLECTIVE_MEM_SIZE_MB=8192 XLA_PYTHON_CLIENT_MEM_FRACTION=0.8"
   timeout 150 $UB NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,REG NCCL_DEBUG_FILE=/tmp/nccl_ub.txt $ours $TP4 --steps 2 > /dev/null 2>&1
   grep -i "regist\|ncclMemAlloc\|cuMem" /tmp/nccl_ub.txt* | sed "s/^.*NCCL INFO //" | sort | uniq -c | sort -rn | head -30 > "$out/nccl_info_ub.txt"
   run tp4-sp-mb16-again $ours $TP4
   run dp4-zero2-buf16m env NCCL_BUFFSIZE=16777216 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12 ;;
w) TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   for e in "" NCCL_MIN_NCHANNELS=32 NCCL_MIN_NCHANNELS=64 NCCL_PROTO=LL128 NCCL_BUFFSIZE=16777216; do
     echo "# $e" >> "$out/collective_bw.txt"
     timeout 90 env $e python3 benchmarks/collective_bw.py --mib 8 32 128 >> "$out/collective_bw.txt" 2>>"$out/record.log"
   done
   run tp4-sp-mb16 $ours $TP4
   run tp4-sp-mb16-minch32 env NCCL_MIN_NCHANNELS=32 $ours $TP4
   run tp4-sp-mb16-again $ours $TP4
   run tp4-sp-mb16-minch32-again env NCCL_MIN_NCHANNELS=32 $ours $TP4
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-minch32 env NCCL_MIN_NCHANNELS=32 $ours $DP4 parallel.zero=2 --steps 12 ;;
x) TP4="$B13 --mesh 1,1,4 train.micro_batch_size=16 train.recompute=none parallel.sequence_parallel=true"
   TP75="$B75 --mesh 1,1,4 train.global_batch_size=32 train.recompute=none train.micro_batch_size=8 parallel.sequence_parallel=true --steps 5"
   run tp4-sp-mb16 $ours $TP4
   run tp4-sp-mb16-minch64 env NCCL_MIN_NCHANNELS=64 $ours $TP4
   run tp4-sp-mb16-minch32 env NCCL_MIN_NCHANNELS=32 $ours $TP4
   run tp4-sp-mb16-again $ours $TP4
   run 7.5b-tp4-sp-mb8 $ours $TP75
   run 7.5b-tp4-sp-mb8-minch64 env NCCL_MIN_NCHANNELS=64 $ours $TP75 ;;
y) one_gpu
   T212="$B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16"
   T122="$B13 --mesh 1,2,2 train.micro_batch_size=2 train.recompute=none parallel.sequence_parallel=true parallel.schedule=1f1b-phased"
   run tp212-sp-mb8 $ours $T212
   run tp212-sp-mb8-nccl0 $ours $T212 parallel.nccl_channels=0
   run tp122-sp-phased $ours $T122
   run tp122-sp-phased-nccl0 $ours $T122 parallel.nccl_channels=0
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-cta1 env NCCL_CTA_POLICY=1 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-again $ours $DP4 parallel.zero=2 --steps 12 ;;
z) one_gpu
   run 1gpu-sel-mb1 env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1 train.micro_batch_size=1 train.recompute=selective
   run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b
   run pp4-zbphased-v2-sel $ours $ZB13
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   T212="$B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16"
   COMB="--xla_gpu_all_gather_combine_threshold_bytes=536870912 --xla_gpu_reduce_scatter_combine_threshold_bytes=134217728"
   run tp212-sp-mb8 $ours $T212
   run tp212-sp-mb8-zero2 $ours $T212 parallel.zero=2
   run tp212-sp-mb8-zero2-comb env XLA_FLAGS="$COMB" $ours $T212 parallel.zero=2 ;;
zz) T212="$B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16"
   COMB="--xla_gpu_all_gather_combine_threshold_bytes=536870912 --xla_gpu_reduce_scatter_combine_threshold_bytes=134217728"
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   run tp212-sp-mb8 $ours $T212
   run tp212-sp-mb8-zero2 $ours $T212 parallel.zero=2
   run tp212-sp-mb8-zero2-comb env XLA_FLAGS="$COMB" $ours $T212 parallel.zero=2
   run tp212-sp-mb8-zero1 $ours $T212 parallel.zero=1 ;;
zy) so=$(python3 -c 'import glob, jax_plugins, os; print(" ".join(glob.glob(os.path.dirname(jax_plugins.__path__[0]) + "/jax_plugins/*/*.so")))' 2>/dev/null)
   for f in $so; do strings "$f" | grep -oE "xla_gpu_[a-z0-9_]*(overlap_limit|slop_factor|latency_hiding|collective_memory|memory_limit)[a-z0-9_]*" ; done | sort -u > "$out/xla_flags.txt"
   T212="$B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16 parallel.zero=2"
   OL="--xla_gpu_experimental_parallel_collective_overlap_limit=2"; SL="--xla_gpu_memory_limit_slop_factor=20"
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-overlap2 env XLA_FLAGS="$OL" $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-slop20 env XLA_FLAGS="$SL" $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero0 $ours $DP4 --steps 12
   run tp212-zero2 $ours $T212
   run tp212-zero2-overlap2 env XLA_FLAGS="$OL" $ours $T212
   run tp212-zero2-slop20 env XLA_FLAGS="$SL" $ours $T212 ;;
zy2) so=$(python3 -c 'import glob, jax_plugins, os; print(" ".join(glob.glob(os.path.dirname(jax_plugins.__path__[0]) + "/jax_plugins/*/*.so")))' 2>/dev/null)
   for f in $so; do strings "$f" | grep -oE "xla_gpu_[a-z0-9_]*(overlap_limit|slop_factor|latency_hiding|collective_memory|memory_limit)[a-z0-9_]*" ; done | sort -u > "$out/xla_flags.txt"
   DP2="$B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
   OL="--xla_gpu_experimental_parallel_collective_overlap_limit=2"; SL="--xla_gpu_memory_limit_slop_factor=20"
   run dp2-zero2 $ours $DP2 parallel.zero=2
   run dp2-zero2-overlap2 env XLA_FLAGS="$OL" $ours $DP2 parallel.zero=2
   run dp2-zero2-slop20 env XLA_FLAGS="$SL" $ours $DP2 parallel.zero=2
   run dp2-zero0 $ours $DP2 ;;
zx) DP2="$B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none parallel.grad_reduce_dtype=bfloat16"
   run dp2-zero2 $ours $DP2 parallel.zero=2
   run dp2-zero0 $ours $DP2
   run dp2-zero1 $ours $DP2 parallel.zero=1 ;;
za) one_gpu
   T212="$B13 --mesh 2,1,2 train.micro_batch_size=8 train.recompute=none parallel.sequence_parallel=true parallel.grad_reduce_dtype=bfloat16"
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero0 $ours $DP4 --steps 12
   run dp4-zero1 $ours $DP4 parallel.zero=1 --steps 12
   run dp4-zero2-again $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-train python3 benchmarks/bench_train.py $DP4 parallel.zero=2 --steps 30
   run tp212-sp-mb8 $ours $T212
   run tp212-sp-mb8-zero2 $ours $T212 parallel.zero=2 ;;
zb) one_gpu
   run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-ag256 $ours $DP4 parallel.zero=2 --steps 12 --combine-mib 256,128
   run dp4-zero2-ag128 $ours $DP4 parallel.zero=2 --steps 12 --combine-mib 128,128
   run dp4-zero2-again $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-b2b $ours $DP4 parallel.zero=2 --trace-dir /tmp/tr_z2 --trace-steps 3 --back-to-back
   tr=$(newest_trace /tmp/tr_z2); [[ -n $tr ]] && cp "$tr" "$out/trace_dp4-zero2-b2b.json.gz" &&
     python3 benchmarks/nccl_timeline.py "$tr" > "$out/nccl_dp4-zero2.md" 2>&1 &&
     python3 benchmarks/idle_gaps.py "$tr" --top 12 --min-us 200 > "$out/gaps_dp4-zero2.md" 2>&1 ;;
zc) BT="python3 benchmarks/bench_train.py"; G1="env CUDA_VISIBLE_DEVICES=0"
   one_gpu
   run 1gpu-none-mb4 $G1 $ours $B13 --mesh 1,1,1 train.micro_batch_size=4 train.recompute=none
   run 1gpu-none-mb8-train $G1 $BT $B13 --mesh 1,1,1 train.micro_batch_size=8 train.recompute=none --steps 24 --tag 1gpu-none-mb8-train
   run 1gpu-none-mb4-train $G1 $BT $B13 --mesh 1,1,1 train.micro_batch_size=4 train.recompute=none --steps 24 --tag 1gpu-none-mb4-train
   run dp4-zero2-train $BT $DP4 parallel.zero=2 --steps 40 --tag dp4-zero2-train ;;
zi) run dp4-zero2 $ours $DP4 parallel.zero=2 --steps 12
   run dp4-zero2-b2b $ours $DP4 parallel.zero=2 --trace-dir /tmp/tr_z2 --trace-steps 3 --back-to-back
   tr=$(newest_trace /tmp/tr_z2); [[ -n $tr ]] && cp "$tr" "$out/trace_dp4-zero2-b2b.json.gz" &&
     python3 benchmarks/nccl_timeline.py "$tr" > "$out/nccl_dp4-zero2.md" 2>&1 &&
     python3 benchmarks/idle_gaps.py "$tr" --top 12 --min-us 200 > "$out/gaps_dp4-zero2.md" 2>&1
   TRACE_STEPS=3 prof dp4-zero2 /tmp/tr_z2 4,1,1 --back-to-back train.micro_batch_size=4 train.recompute=none parallel.grad_reduce_dtype=bfloat16 parallel.zero=2
   G4="$B13 --mesh 1,1,1 train.global_batch_size=4 train.micro_batch_size=4 train.recompute=none"
   run 1gpu-gb4-mb4-b2b env CUDA_VISIBLE_DEVICES=0 $ours $G4 --trace-dir /tmp/tr_g4 --trace-steps 3 --back-to-back
   TRACE_STEPS=3 prof 1gpu-gb4-mb4 /tmp/tr_g4 1,1,1 --back-to-back train.global_batch_size=4 train.micro_batch_size=4 train.recompute=none ;;
zh) run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
   run 7.5b-pp4-zbphased-v3-mb2 $ours $ZB75 --steps 8 ;;
esac
