#!/usr/bin/env bash
# Twenty-third session, seventh call ($OUT set; carry dev-bin: octet = HEAD
# after the review, adamw and adamw_many sharing adamw_elem):
# - `octet selftest --device cuda`;
# - ~1B LoRA step, FP8 and bf16 bases, two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora g-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora g-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
