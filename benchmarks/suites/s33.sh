# Sourced by benchmarks/record_suite.sh (SUITE=s33, S33_PART=a|...). 2 GPUs (no 4-GPU kind lent
# in session 33), ~500 s a part.
# Part a: t = 2 against d = 2 on one host, the 2-GPU stand-in for issue 11 target 2's (2,1,2)
# against (4,1,1): the same per-GPU work (8 sequences' FLOPs a GPU a step). (1,1,2) sequence
# parallel micro 16 (m 1, the tensor ring on under auto) twice, the second traced; with XLA's
# overlap limit 4 (the loss question of session 32's part e: does the flag alone move the
# losses?); plain (no ring) as the loss reference; (2,1,1) zero 2 micro 8 with and without the
# limit; the one-GPU micro-8 baseline.
export CASE_TIMEOUT=${CASE_TIMEOUT:-200}
case "${S33_PART:-a}" in
a) one_gpu
   run dp2-zero2 $ours $DP2 --steps 10
   run tp2-sp-mb16-auto $ours $TP2 --steps 8
   run tp2-sp-mb16-auto-lim4 env XLA_FLAGS=$LIM4 $ours $TP2 --steps 8
   run tp2-sp-mb16-plain $ours $TP2 parallel.tp_comm_overlap=false --steps 8
   run dp2-zero2-lim4 env XLA_FLAGS=$LIM4 $ours $DP2 --steps 10
   run tp2-sp-mb16-auto-traced $ours $TP2 --steps 8 --trace-dir /tmp/tr_t2 --trace-steps 2
   profiled tp2-sp-mb16-auto-traced /tmp/tr_t2 $TP2 ;;
b) # the optimized HLO of part a's traced ring step (its fusions by name, for the trace)
   run tp2-sp-mb16-auto-dump env XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_step_fn" $ours $TP2 --steps 3
   f=$(ls -S /tmp/hlo/*jit_step_fn*after_optimizations.txt | head -1)
   [[ -n "$f" ]] && gzip -c "$f" > "$out/hlo_tp2-sp-mb16-auto.txt.gz"; rm -rf /tmp/hlo ;;
c) # one index program per block (sharding.rank_plus) against the code before it, carried as
   # .old/ptdp_jax (PYTHONPATH=.old puts it first), A/B/A/B; then the new HLO's slice fusions
   OLD="env PYTHONPATH=.old:."
   run tp2-sp-mb16-old $OLD $ours $TP2 --steps 8
   run tp2-sp-mb16-new $ours $TP2 --steps 8
   run tp2-sp-mb16-old-b $OLD $ours $TP2 --steps 8
   run tp2-sp-mb16-new-b $ours $TP2 --steps 8
   run tp2-sp-mb16-new-dump env XLA_FLAGS="--xla_dump_to=/tmp/hlo --xla_dump_hlo_as_text --xla_dump_hlo_module_re=jit_step_fn" $ours $TP2 --steps 3
   f=$(ls -S /tmp/hlo/*jit_step_fn*after_optimizations.txt | head -1)
   [[ -n "$f" ]] && gzip -c "$f" > "$out/hlo_tp2-sp-mb16-new.txt.gz"; rm -rf /tmp/hlo ;;
d) # the ratio in one lease after rank_plus, and the new ring step traced
   one_gpu
   run dp2-zero2 $ours $DP2 --steps 10
   run tp2-sp-mb16-auto $ours $TP2 --steps 8
   run tp2-sp-mb16-auto-traced $ours $TP2 --steps 8 --trace-dir /tmp/tr_t2 --trace-steps 2
   profiled tp2-sp-mb16-auto-traced /tmp/tr_t2 $TP2 ;;
e) # 4 GPUs (lent late in session 33): rank_plus on (1,1,4) SP micro 16 against .old, A/B/A/B
   OLD="env PYTHONPATH=.old:."
   run tp4-sp-mb16-new $ours $TP4A --steps 8
   run tp4-sp-mb16-old $OLD $ours $TP4A --steps 8
   run tp4-sp-mb16-new-b $ours $TP4A --steps 8
   run tp4-sp-mb16-old-b $OLD $ours $TP4A --steps 8
   one_gpu ;;
esac
