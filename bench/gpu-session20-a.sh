#!/usr/bin/env bash
# Twentieth session, first call ($OUT set; carry dev-bin): activation
# recomputation (`--recompute`). The selftest (its recomputation cases check
# two AdamW steps bit for bit against the model keeping every block), then
# the ~1B model at batch 16 x 2048 with and without it (bf16, tensorwise,
# tensorwise with FP8 saved activations and the dequantized backward), and
# at batch 32, which only fits with it.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
grep -E "recomputation|recomputing" $R/selftest.txt | cut -c1-200 | tee $R/recompute-cases.txt
for r in bf16 tensorwise; do
  for rc in "" --recompute; do
    run1b dev-bin/octet train t-$r$rc 16 10 4 --recipe $r $rc | tee -a $R/train.txt
  done
done
for rc in "" --recompute; do
  run1b dev-bin/octet train t-fp8saved$rc 16 10 4 --recipe tensorwise --backward dequantized --saved-activations fp8 $rc | tee -a $R/train.txt
done
echo "batch 16 done ($((SECONDS-t0)) s)"
for r in bf16 tensorwise; do
  run1b dev-bin/octet train t32-$r 32 8 3 --recipe $r --recompute | tee -a $R/train.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
