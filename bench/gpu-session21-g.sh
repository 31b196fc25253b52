#!/usr/bin/env bash
# Twenty-first session, last call ($OUT set; carry dev-bin = 78a4bae): issue 5's
# targets on HEAD.
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base (quantized
#   backward, FP8 saved activations) and bf16 base alternated three times;
# - peak memory: FP8 base with the dequantized backward and FP8 saved
#   activations against the bf16 base (the 0.6x target's setting);
# - ~1B training (batch 16): tensorwise and bf16 (issue 4's 1.3x, with the
#   forward's fast accumulation).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2 3; do
  run1b dev-bin/octet lora l-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
run1b dev-bin/octet lora l-fp8-deq 4 8 3 --base-format fp8-tensorwise --compute fp8 --backward dequantized \
  --saved-activations fp8 | tee -a $R/lora.txt
echo "lora ($((SECONDS-t0)) s)"
run1b dev-bin/octet train t-tw 16 10 4 --recipe tensorwise | tee -a $R/train.txt
run1b dev-bin/octet train t-bf16 16 10 4 --recipe bf16 | tee -a $R/train.txt
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
