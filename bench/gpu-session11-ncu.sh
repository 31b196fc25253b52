#!/usr/bin/env bash
# Per-kernel GPU time of the ~1B LoRA step, FP8 base (compute fp8, quantized
# backward) vs bf16 base: ncu's gpu__time_duration of 900 launches after the
# first 1800 (the end of one step's backward, a whole forward, the start of the
# next backward). ncu runs each kernel alone with cold caches, so small kernels
# read slower than in the step. Run on the lent GPU with $OUT set.
set -uo pipefail
bin=dev-bin/octet
for cfg in "fp8-tensorwise fp8 quantized" "bf16 bf16 high_precision"; do
  set -- $cfg
  /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --launch-skip 1800 --launch-count 900 \
    $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 4 --eval-batches 0 --sample-tokens 0 --no-save \
    --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name n-$1 > $OUT/ncu-$1.csv 2>$OUT/ncu-$1.err
  wc -l $OUT/ncu-$1.csv
done
