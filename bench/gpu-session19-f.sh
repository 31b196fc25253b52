#!/usr/bin/env bash
# Nineteenth session, last call ($OUT set; carry dev-bin): the GPU LoRA
# layers keep the masked input under dropout where nothing else holds the
# input (dev-bin/octet) against the binary before (dev-bin/octet-old, the
# bf16-sums commit): selftest, then the ~1B LoRA step (FP8 base, quantized
# backward, FP8 saved activations) with dropout 0.1, alternated, and once
# without.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
for rep in 1 2; do
  for bin in octet-old octet; do
    run1b dev-bin/$bin lora l-$bin-drop-$rep 4 8 3 $fp8 --lora-dropout 0.1 | tee -a $R/lora.txt
  done
done
run1b dev-bin/octet lora l-nodrop 4 8 3 $fp8 | tee -a $R/lora.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
