#!/usr/bin/env bash
# Twenty-first session, check ($OUT set; carry dev-bin = 78a4bae): does the
# LoRA step's device memory (the driver's used memory after each forward)
# keep growing? Call g saw the dequantized FP8-base run flat at 6.96 GiB for
# 7 steps and 7.33 at step 8, with the pool's allocated high-water mark flat.
# 20 steps each: dequantized and quantized FP8 base, bf16 base.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run1b dev-bin/octet lora l-deq 4 20 3 --base-format fp8-tensorwise --compute fp8 --backward dequantized \
  --saved-activations fp8 | tee -a $R/lora.txt
run1b dev-bin/octet lora l-q 4 20 3 --base-format fp8-tensorwise --compute fp8 --backward quantized \
  --saved-activations fp8 | tee -a $R/lora.txt
run1b dev-bin/octet lora l-bf16 4 20 3 --base-format bf16 --compute bf16 --backward high_precision | tee -a $R/lora.txt
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
