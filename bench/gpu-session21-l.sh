#!/usr/bin/env bash
# Twenty-first session, last call ($OUT set; carry dev-bin = HEAD after the
# side stream's removal): `octet selftest --device cuda`, and the ~1B LoRA
# step, FP8 base (quantized backward, FP8 saved activations) and bf16 base
# alternated twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora l-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
