#!/usr/bin/env bash
# Fourteenth session, last H100 call ($OUT set; carry dev-bin): selftest of
# the final binary after the review commit (the padding helpers shared; the
# block weight-gradient case at 1040 tokens), and the ~1B LoRA step once per base.
set -uo pipefail
t0=$SECONDS
bin=dev-bin/octet
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
grep -E "block-scaled" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-160
. bench/session12_runs.sh
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  run1b $bin lora l-$1-$2-$3 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
done
timeout 200 $bin compare --device cuda --recipes bf16,blockwise --batch 4 --seq 80 \
  --out-dir /tmp/cmp --name b4 > $OUT/compare-b4.txt 2>&1; echo "compare (batch 4 x 80 = 320 tokens) rc=$?"
tail -5 $OUT/compare-b4.txt
echo "done ($((SECONDS-t0)) s)"
