#!/usr/bin/env bash
# Nineteenth session, second call ($OUT set; carry dev-bin): the selftest
# with dropout cases per path (fused cast + du or not, d_input given or
# not; the first call failed the model case comparing the two paths under
# dropout), and the ~1B LoRA step with and without dropout 0.1 after the
# mask moved to 16 bits per element from one 64-bit hash per 4 elements
# (was a 64-bit hash per element) with vector loads.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
B=dev-bin/octet
R=$OUT/r
mkdir -p $R
run_selftest $B $R/selftest.txt
grep -iE "dropout|fused cast \+ du against" $R/selftest.txt | sed 's/   */ /g' | cut -c1-330
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
for rep in 1 2; do
  run1b $B lora l-nodrop-$rep 4 8 3 $fp8 | tee -a $R/steps.txt
  run1b $B lora l-drop-$rep 4 8 3 $fp8 --lora-dropout 0.1 | tee -a $R/steps.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
