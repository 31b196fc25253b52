#!/usr/bin/env bash
# Twentieth session, fifth call ($OUT set; carry dev-bin): partial
# recomputation (--recompute-blocks N). The selftest (every block and the
# first only, plain, LoRA and sharded on one rank), then the ~1B model at
# batch 16 x 2048 recomputing 0, 4, 8, 12 and 16 of its 16 blocks (bf16 and
# tensorwise).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
for r in bf16 tensorwise; do
  run1b dev-bin/octet train t-$r-0 16 10 4 --recipe $r | tee -a $R/train.txt
  for nb in 4 8 12; do
    run1b dev-bin/octet train t-$r-$nb 16 10 4 --recipe $r --recompute-blocks $nb | tee -a $R/train.txt
  done
  run1b dev-bin/octet train t-$r-all 16 10 4 --recipe $r --recompute | tee -a $R/train.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
