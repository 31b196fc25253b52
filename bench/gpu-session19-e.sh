#!/usr/bin/env bash
# Nineteenth session, extra call ($OUT set; carry dev-bin): issue 4's
# per-recipe figures on the final binary: ~1B, batch 16 x 2048, 10 steps,
# tokens/s over steps 4-10 and peak device memory, every recipe with its
# default backward, then tensorwise dequantized with FP8 saved activations
# (the memory target).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
for rec in bf16 tensorwise delayed rowwise blockwise mxfp8 nvfp4; do
  run1b dev-bin/octet train r-$rec 16 10 4 --recipe $rec | tee -a $R/recipes.txt
  echo "($((SECONDS-t0)) s)"
done
run1b dev-bin/octet train r-deq-fp8 16 10 4 --recipe tensorwise --backward dequantized --saved-activations fp8 | tee -a $R/recipes.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
