#!/usr/bin/env bash
# Fourteenth session, fourth H100 call ($OUT set; carry dev-bin): LoRA with
# the adapters' term written before the base's GEMM adds to it (besides the
# grouped adapters of the third call), against the session's starting binary
# (dev-bin/octet-old, 9719f48); selftest; the ~1B training step unchanged.
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
timeout 300 $new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
grep -E "LoRA" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-170 | head -30
. bench/session12_runs.sh
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full" "fp8-tensorwise bf16 dequantized fp8"; do
  set -- $cfg
  for bin in $new $old $new $old; do
    run1b $bin lora l-$(basename $bin)-$1-$2-$3 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
  done
done
for r in bf16 tensorwise; do
  run1b $new train t-$r 16 10 4 --recipe $r
done
echo "done ($((SECONDS-t0)) s)"
