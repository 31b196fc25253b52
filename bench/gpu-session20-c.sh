#!/usr/bin/env bash
# Twentieth session, third call ($OUT set; carry dev-bin): the selftest after
# the review's changes, then the ~1B LoRA step (batch 4 x 2048, r 16 on all
# seven projections) with and without --recompute: FP8 base (quantized
# backward, FP8 saved activations) and bf16 base (high-precision backward),
# and the FP8 base at batch 16, which the recomputation makes cheaper to hold.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rc in "" --recompute; do
  run1b dev-bin/octet lora l-fp8$rc 4 8 3 $fp8 $rc | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16$rc 4 8 3 $bf16 $rc | tee -a $R/lora.txt
done
for rc in "" --recompute; do
  run1b dev-bin/octet lora l16-fp8$rc 16 6 3 $fp8 $rc | tee -a $R/lora.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
