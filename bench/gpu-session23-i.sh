#!/usr/bin/env bash
# Twenty-third session, ninth call ($OUT set; carry dev-bin: octet = call h's
# binary with the memory pool's opportunistic reuse off; octet-opp = call h's
# binary): does the pool's reserved peak stop varying between runs (call h:
# 6.44-6.47 GiB in six FP8 runs, 6.91-7.00 in two)? ~1B LoRA step, FP8 base
# six times, bf16 base twice, and the old binary's FP8 twice beside them.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2 3 4 5 6; do
  run1b dev-bin/octet lora i-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  case $rep in
    2|5) run1b dev-bin/octet-opp lora i-fp8opp-$rep 4 8 3 $fp8 | tee -a $R/lora.txt ;;
    3|6) run1b dev-bin/octet lora i-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt ;;
  esac
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
