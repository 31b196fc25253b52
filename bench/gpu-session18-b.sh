#!/usr/bin/env bash
# Eighteenth session ($OUT set; carry dev-bin): the LoRA backward's fused
# E5M2 cast + du (`lora_cast_du`, one read of each output gradient) on the
# ~1B LoRA step. selftest of the new binary, then the step with the FP8 base
# (compute fp8, quantized backward, FP8 saved activations) by the starting
# binary (dev-bin/octet-old, 8a7ed57) and the new one, alternated, and the
# bf16 base; batch 4 x 2048, r = 16 on all seven projections.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$?"; grep -E "cases pass|FAIL" $R/selftest.txt | head -5
grep -E "fused" $R/selftest.txt | cut -c1-400
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
for rep in 1 2; do
  for bin in octet-old octet; do
    run1b dev-bin/$bin lora l-$bin-$rep 4 8 3 $fp8 | tee -a $R/steps.txt
    grep -E "peak" /tmp/run1b.txt | tail -1 >> $R/steps.txt
  done
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 --base-format bf16 --compute bf16 --backward high_precision | tee -a $R/steps.txt
done
run1b dev-bin/octet lora l-full 4 8 3 --base-format fp8-tensorwise --compute fp8 --backward quantized | tee -a $R/steps.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
