#!/usr/bin/env bash
# Twentieth session, fourth call ($OUT set; carry dev-bin): LoRA's
# recomputation without the down projection's base and B products; the
# selftest, then the ~1B LoRA step at batch 4 with --recompute (FP8 and bf16
# bases) and without (FP8 base), as in the third call.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
grep -E "recomputation \(LoRA" $R/selftest.txt | cut -c1-160
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
run1b dev-bin/octet lora l-fp8 4 8 3 $fp8 | tee -a $R/lora.txt
run1b dev-bin/octet lora l-fp8-rc 4 8 3 $fp8 --recompute | tee -a $R/lora.txt
run1b dev-bin/octet lora l-bf16-rc 4 8 3 $bf16 --recompute | tee -a $R/lora.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
