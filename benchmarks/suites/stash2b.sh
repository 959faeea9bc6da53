# Sourced by benchmarks/record_suite.sh (SUITE=stash2b), which defines the helpers (run,
# one_gpu, prof, profiled, traced, step_of, finish) and B13, B75, P13, P75, L75, ours, peer.
# parallel.static_stash on the other schedules, (1,2,1) m 16, each against the dynamic stash.
export CASE_TIMEOUT=${CASE_TIMEOUT:-180}
PP="$B13 --mesh 1,2,1 train.micro_batch_size=1"; ST="parallel.static_stash=true"
I2="parallel.schedule=interleaved parallel.virtual_stages=2"
ZV="parallel.schedule=zb-v parallel.virtual_stages=2"
run pp2-1f1b-sel $ours $PP
run pp2-1f1b-sel-static $ours $PP $ST
run pp2-i2-sel $ours $PP $I2
run pp2-i2-sel-static $ours $PP $I2 $ST
run pp2-zbv-sel $ours $PP $ZV
run pp2-zbv-sel-static $ours $PP $ZV $ST
