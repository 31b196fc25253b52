#!/usr/bin/env bash
# Twenty-third session, fifth call ($OUT set; carry dev-bin: octet = 38f0c1d
# (d_A's reduction inside its kernel, AdamW and gradient adds over many
# tensors a launch, grouped transposes); octet-s22 = 5103e39, the session's
# start): ~1B LoRA step, FP8 and bf16 bases, both binaries, three rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2 3; do
  run1b dev-bin/octet lora e-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-s22 lora e-fp8s22-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora e-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
  run1b dev-bin/octet-s22 lora e-bf16s22-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
