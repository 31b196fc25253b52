#!/usr/bin/env bash
# Twenty-third session, eighth call ($OUT set; carry dev-bin: octet = HEAD with
# the pool's reserved high-water mark in the metrics): where the device peak's
# excursions (7.24-7.27 GiB in two FP8 runs of calls c and e, 6.96-7.05 in
# the others) come from. ~1B LoRA step, FP8 base six times, FP8 base with
# CUDA_MODULE_LOADING=EAGER twice, bf16 base twice: device peak, pool
# allocated and reserved peaks.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2 3 4 5 6; do
  run1b dev-bin/octet lora h-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  case $rep in
    2|4) CUDA_MODULE_LOADING=EAGER run1b dev-bin/octet lora h-fp8eager-$rep 4 8 3 $fp8 | tee -a $R/lora.txt ;;
    3|6) run1b dev-bin/octet lora h-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt ;;
  esac
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
