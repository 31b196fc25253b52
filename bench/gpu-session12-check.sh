#!/usr/bin/env bash
# Twelfth session, third H100 call: does the new binary train as the old one
# did? Default small model (final validation loss; bf16, tensorwise quantized,
# tensorwise dequantized with FP8 saved activations), new and old; the ~1B
# model's first 5 steps (loss, gradient norm), tensorwise quantized with FP8
# saved activations, new and old; and the peak memory of tensorwise
# dequantized + FP8 saved at batch 16 (the 0.7x target's configuration).
# Run on the lent GPU with $OUT set (carry dev-bin).
set -uo pipefail
t0=$SECONDS
steps() {
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
print("   " + "; ".join(f"{r['step']}: {r['loss']:.4f} g {r.get('grad_norm', float('nan')):.2f}" for r in rows))
PY
}
for b in new old; do
  bin=dev-bin/octet; [ $b = old ] && bin=dev-bin/octet-old
  for cfg in "bf16 high_precision full" "tensorwise quantized full" "tensorwise dequantized fp8"; do
    set -- $cfg
    echo "-- $b: default small model, recipe $1 backward $2 saved $3"
    $bin train --device cuda --recipe $1 --backward $2 --saved-activations $3 --sample-tokens 0 --no-save \
      --out-dir /tmp/runs --name s-$b-$1-$2-$3 > /tmp/s.txt 2>&1 || tail -5 /tmp/s.txt
    grep -E "^(bf16|i:)" /tmp/s.txt | tail -1 | sed 's/  */ /g'
  done
  echo "-- $b: 1b tensorwise quantized fp8, batch 4, 5 steps"
  $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 5 --eval-batches 0 --sample-tokens 0 --no-save \
    --recipe tensorwise --backward quantized --saved-activations fp8 --out-dir /tmp/runs --name c-$b > /tmp/c.txt 2>&1 || tail -5 /tmp/c.txt
  steps /tmp/runs/c-$b/metrics.jsonl
done
echo "-- new: train 1b tensorwise dequantized fp8, batch 16"
dev-bin/octet train --device cuda --model 1b --batch 16 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 --no-save \
  --recipe tensorwise --backward dequantized --saved-activations fp8 --out-dir /tmp/runs --name m-deq > /tmp/m.txt 2>&1 || tail -5 /tmp/m.txt
python3 bench/metrics_summary.py /tmp/runs/m-deq/metrics.jsonl 32768 3
echo "done ($((SECONDS-t0)) s)"
