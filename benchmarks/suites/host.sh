# Sourced by benchmarks/record_suite.sh (SUITE=host), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# A/B of a code change against BASE (an export of the previous commit, carried), with the
# host-time summary of each traced case (benchmarks/host_time.py).
base="env PYTHONPATH=${BASE:-.base} python3 ${BASE:-.base}/benchmarks/capture_step.py"
CB="--xla_gpu_enable_command_buffer"
run 1gpu-sel-mb8 env CUDA_VISIBLE_DEVICES=0 python3 benchmarks/capture_step.py $B13 --mesh 1,1,1 train.micro_batch_size=8
run peer-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P13
run base-pp4-1f1b $base $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/t1; traced base-pp4-1f1b /tmp/t1
run base-pp4-1f1b-nocond env XLA_FLAGS="$CB=-CONDITIONAL" $base $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/t2; traced base-pp4-1f1b-nocond /tmp/t2
run new-pp4-1f1b $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 --trace-dir /tmp/t3; traced new-pp4-1f1b /tmp/t3
run new-pp4-int2 $ours $B13 --mesh 1,4,1 train.micro_batch_size=1 parallel.schedule=interleaved parallel.virtual_stages=2 --trace-dir /tmp/t4; traced new-pp4-int2 /tmp/t4 105
run new-7.5b-pp4-1f1b $ours $B75 --mesh 1,4,1 $L75 train.recompute=selective --steps 4
run peer-7.5b-pp4-1f1b $peer --dp 1 --pp 4 --tp 1 --schedule 1f1b $P75
