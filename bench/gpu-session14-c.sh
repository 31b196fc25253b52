#!/usr/bin/env bash
# Fourteenth session, third H100 call ($OUT set; carry dev-bin): LoRA
# adapters grouped by shared input (one u = x A^T product for q, k, v and
# for gate, up; one d_A and one d_input product), against the session's
# starting binary (dev-bin/octet-old, 9719f48), and the blockwise padding
# (k = 352 cases) in the selftest.
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
timeout 300 $new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|error" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
grep -E "block-scaled|LoRA|lora" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-170 | head -60
. bench/session12_runs.sh
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full" "fp8-tensorwise fp8 dequantized full"; do
  set -- $cfg
  for bin in $new $old $new $old; do
    run1b $bin lora l-$(basename $bin)-$1-$3 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
  done
done
echo "done ($((SECONDS-t0)) s)"
