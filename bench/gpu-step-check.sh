#!/usr/bin/env bash
# Training-step check on the lent GPU ($OUT set): the conformance suite, the
# ~1B training step (bf16, tensorwise) and the per-kernel times of one step.
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|attention|all .* cases" $OUT/selftest.txt | cut -c1-200
train="$bin train --device cuda --model 1b --batch 4 --seq 2048 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs"
for r in "bf16 high_precision" "tensorwise quantized"; do
  set -- $r
  $train --steps 6 --recipe $1 --backward $2 --name t-$1 > $OUT/train-$1.txt 2>&1; tail -4 $OUT/train-$1.txt | head -3 | cut -c1-200
done
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  $train --steps 2 --recipe bf16 --name n > $OUT/ncu-step-bf16.csv 2> $OUT/ncu-step-bf16.err
echo "ncu rc=$?"
timeout 200 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
  $train --steps 2 --recipe tensorwise --backward quantized --name n2 > $OUT/ncu-step-tensorwise.csv 2> $OUT/ncu-step-tensorwise.err
echo "ncu rc=$?"
