#!/usr/bin/env bash
# Twenty-second session, eighth call ($OUT set; carry dev-bin: octet = the d_A
# per-split sums in one kept scratch instead of an allocation a call;
# octet-prev = 34719ec, call f's binary):
# - `octet selftest --device cuda`;
# - ~1B LoRA step, 20 steps (device memory over the steps: call f's FP8 run
#   rose from 6.99 to 7.24 GiB by step 20): FP8 base (quantized backward, FP8
#   saved activations) new, prev, new; bf16 base.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
run1b dev-bin/octet lora h-fp8-1 4 20 3 $fp8 | tee -a $R/lora.txt
run1b dev-bin/octet-prev lora h-fp8prev 4 20 3 $fp8 | tee -a $R/lora.txt
run1b dev-bin/octet lora h-bf16 4 20 3 $bf16 | tee -a $R/lora.txt
run1b dev-bin/octet lora h-fp8-2 4 20 3 $fp8 | tee -a $R/lora.txt
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
