# Sourced by benchmarks/record_suite.sh (SUITE=s30d). 4 GPUs, ~450 s. Session 30, issue 8/9: part
# a found selective recomputation 3% slower than none at micro 1 on one GPU (H100), where
# session 18 found none 8.7% slower in a p = 4 pipeline (H200, before keep_ffn_activation). The
# 1.3B (1,4,1) m 16 1f1b and zb-phased v 2 with recompute none against selective, one GPU first.
export CASE_TIMEOUT=${CASE_TIMEOUT:-240}
one_gpu
run pp4-1f1b-sel $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b --steps 8
run pp4-1f1b-none $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=1f1b train.recompute=none --steps 8
ZB13="$B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=zb-phased parallel.virtual_stages=2 --steps 8"
run pp4-zbphased-v2-none $ours $ZB13 train.recompute=none
run pp4-zbphased-v2-sel $ours $ZB13
