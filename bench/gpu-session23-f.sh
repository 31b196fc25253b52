#!/usr/bin/env bash
# Twenty-third session, sixth call ($OUT set; carry dev-bin: octet = 38f0c1d;
# octet-nt = the same without the grouped transposes of frozen codes): the
# ~1B LoRA step with the FP8 base, 12 steps, both binaries alternated four
# times (step time, and the device peak that calls c and e saw rise to
# 7.24-7.27 GiB in one run each with the grouped transposes).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
for rep in 1 2 3 4; do
  run1b dev-bin/octet lora f-fp8-$rep 4 12 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-nt lora f-fp8nt-$rep 4 12 3 $fp8 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
