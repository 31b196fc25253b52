#!/usr/bin/env bash
# Twenty-first session ($OUT set; carry dev-bin): what the frozen codes'
# transposes on the side stream are worth on their own. dev-bin/octet-noahead
# is f046b3c with `transpose_ahead` turned off (the transposes inline, on the
# main stream, as before 1badd30); dev-bin/octet is f046b3c. ~1B LoRA step,
# FP8 base, alternated three times.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
for rep in 1 2 3; do
  run1b dev-bin/octet lora l-ahead-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-noahead lora l-inline-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
