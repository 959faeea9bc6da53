# Sourced by benchmarks/record_suite.sh (SUITE=s30), which defines the helpers (run, one_gpu,
# newest_trace, step_of, finish) and B13, ours. Written in session 30 (only 1- and 2-GPU kinds
# lent). Every open target (issue 8 t1, 9 t1, 10 t1) is bounded by what small microbatches
# cost on one GPU (NOTES issue 8 "Session 30"). Part a (one GPU, ~360 s): the 1.3B at global
# batch 16 (the same FLOPs a step) without recomputation at micro 8, 4, 2 and 1, and selective
# at micro 1, each timed and two steps traced; benchmarks/kernel_diff.py then lists by kernel
# family what each costs over micro 8 (and selective over none at micro 1).
export CASE_TIMEOUT=${CASE_TIMEOUT:-150}
G1="env CUDA_VISIBLE_DEVICES=0 $ours $B13 --mesh 1,1,1 --steps 6 --trace-steps 2"
TR=/tmp/s30_traces; mkdir -p $TR   # the device returns at most 8 files: traces stay here
diff_of() {   # diff_of BASE OTHER: kernel_diff of two kept traces into OUTDIR/diff_BASE_OTHER.md
  [[ -f "$TR/$1.json.gz" && -f "$TR/$2.json.gz" ]] && python3 benchmarks/kernel_diff.py \
    "$TR/$1.json.gz" "$TR/$2.json.gz" --names "$1,$2" --top 30 > "$out/diff_$1_$2.md" 2>&1
}
keep() {   # keep TAG DIR: the case's trace as $TR/TAG.json.gz
  local f; f=$(newest_trace "$2"); [[ -n "$f" ]] && cp "$f" "$TR/$1.json.gz"; rm -rf "$2"
}
pack() {   # pack TAG...: the named traces in one OUTDIR/traces.tar if under 16 MB
  (cd $TR && tar cf "$out/traces.tar" $(for t in "$@"; do echo "$t.json.gz"; done) 2>/dev/null)
  (( $(stat -c %s "$out/traces.tar" 2>/dev/null || echo 0) < 16000000 )) || rm -f "$out/traces.tar"
}
case "${S30_PART:-a}" in
a) for b in 8 4 2 1; do
     run none-mb$b $G1 train.micro_batch_size=$b train.recompute=none --trace-dir /tmp/t$b
     keep none-mb$b /tmp/t$b
   done
   run sel-mb1 $G1 train.micro_batch_size=1 train.recompute=selective --trace-dir /tmp/ts1
   keep sel-mb1 /tmp/ts1
   for o in none-mb4 none-mb2 none-mb1; do diff_of none-mb8 $o; done
   diff_of none-mb1 sel-mb1
   pack none-mb8 none-mb1 ;;
esac
