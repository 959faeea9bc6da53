# Sourced by benchmarks/record_suite.sh (SUITE=s22x2): 2 GPUs (carry .peer), session 22. No
# 4-GPU kind is lent this session, so session 21's three executor changes get their A/B at
# (1,2,1), each against the default in the same call (NOTES issue 8 section 24 has the
# predictions), and issue 10's zero 1 / 2 with a bf16 reduction at (2,1,1).
# Part a (~540 s): one GPU, the 1.3B zb-phased v 2 default / empty_buffers / overlap_p2p /
# keep_ffn_activation / default again (HLO copies of the first two counted).
# Part b (~540 s): plain 1f1b, zb-phased v 2 with both executor changes, (2,1,1) zero 0 / 2 /
# 1 bf16 micro 8, NCCL_MIN_NCHANNELS=32, the peer's pp2 1f1b.
# Part c (~450 s): keep_ffn_activation on 1f1b, 1f1b-phased and one GPU, each A/B.
export CASE_TIMEOUT=${CASE_TIMEOUT:-240} JAX_COMPILATION_CACHE_DIR=/tmp/jcache
export JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS=0
ZB2="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2 --steps 16"
DP2="$B13 --mesh 2,1,1 train.micro_batch_size=8 train.recompute=none parallel.grad_reduce_dtype=bfloat16 --steps 12"
EB="parallel.empty_buffers=true"; OV="parallel.overlap_p2p=true"
peer2="torchrun --standalone --nproc-per-node 2 $peer_dir/torch_ptd.py"
case "${S22_PART:-a}" in
a) one_gpu
   run pp2-zbphased-v2 $ours $ZB2 --hlo-dir /tmp/h_old
   run pp2-zbphased-v2-emptybuf $ours $ZB2 $EB --hlo-dir /tmp/h_new
   run pp2-zbphased-v2-overlap $ours $ZB2 $OV
   run pp2-zbphased-v2-keepact $ours $ZB2 train.keep_ffn_activation=true
   run pp2-zbphased-v2-again $ours $ZB2
   for d in new old; do [[ -f /tmp/h_$d/step_after_optimizations.txt ]] && python3 benchmarks/hlo_copies.py /tmp/h_$d/step_after_optimizations.txt --min-mb 1 --top 20 > "$out/copies_pp2_zbphased_v2_$d.md" 2>&1; done ;;
b) run pp2-1f1b-sel $ours $B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b --steps 16
   run pp2-zbphased-v2-eb-ov $ours $ZB2 $EB $OV
   run dp2-zero0-bf16-mb8 $ours $DP2
   run dp2-zero2-bf16-mb8 $ours $DP2 parallel.zero=2
   run dp2-zero1-bf16-mb8 $ours $DP2 parallel.zero=1
   run dp2-zero0-bf16-mb8-minch32 env NCCL_MIN_NCHANNELS=32 $ours $DP2
   run peer-pp2-1f1b $peer2 --dp 1 --pp 2 --tp 1 --schedule 1f1b $P13 ;;
c) # keep_ffn_activation on other paths (part a: zb-phased v 2 -1.8%, beyond the drift)
   KA="train.keep_ffn_activation=true"; PH="$B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b-phased --steps 16"
   run pp2-zbphased-v2-keepact-again $ours $ZB2 $KA
   run pp2-1f1b-sel-keepact $ours $B13 --mesh 1,2,1 train.micro_batch_size=1 parallel.schedule=1f1b --steps 16 $KA
   run pp2-phased-sel $ours $PH
   run pp2-phased-sel-keepact $ours $PH $KA
   run 1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1 train.micro_batch_size=8
   run 1gpu-sel-mb8-keepact env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1 train.micro_batch_size=8 $KA ;;
esac
