#!/usr/bin/env bash
# Twenty-first session, second call ($OUT set; carry dev-bin): the LoRA
# backward's two changes (the adapters' du A before the FP8 base products;
# the frozen codes transposed ahead on a side stream).
# - `octet selftest --device cuda` on the new binary;
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base old/new
#   alternated twice, bf16 base once each; FP8 new with dropout 0.1;
# (It also looked for nsys to measure the GPU's idle time inside steps: not
# installed on the device machine.)
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  for b in octet-old octet; do
    run1b dev-bin/$b lora l-fp8-$b-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  done
done
for b in octet-old octet; do run1b dev-bin/$b lora l-bf16-$b 4 8 3 $bf16 | tee -a $R/lora.txt; done
run1b dev-bin/octet lora l-fp8-drop 4 8 3 $fp8 --lora-dropout 0.1 | tee -a $R/lora.txt
echo "steps ($((SECONDS-t0)) s)"
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
