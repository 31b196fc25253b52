#!/usr/bin/env bash
# Eighteenth session ($OUT set; carry dev-bin): `lora_cast_du` with B^T kept
# by AdamW (call c transposed B before each use: 112 small launches a step).
# selftest, then the ~1B LoRA step, starting binary (dev-bin/octet-old,
# 8a7ed57) and new one alternated, FP8 base (compute fp8, quantized backward,
# FP8 saved activations) and bf16 base; batch 4 x 2048, r = 16, all seven.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$?"; grep -E "cases pass|FAIL" $R/selftest.txt | head -5
grep -E "B\^T" $R/selftest.txt | cut -c1-200
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  for bin in octet-old octet; do
    run1b dev-bin/$bin lora l-$bin-$rep 4 8 3 $fp8 | tee -a $R/steps.txt
  done
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/steps.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
