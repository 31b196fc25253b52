#!/usr/bin/env bash
# FP8 saved activations against full ones: per-step loss and gradient norm of
# the ~1B model (4 steps), and the default small model's final validation loss.
# Run on the lent GPU with $OUT set: bash bench/gpu-session11-converge.sh
set -uo pipefail
bin=dev-bin/octet
steps() {
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
print("   " + "; ".join(f"step {r['step']}: loss {r['loss']:.4f} gnorm {r.get('grad_norm', float('nan')):.3f} lr {r.get('lr', 0):.2e}" for r in rows))
PY
}
for cfg in "tensorwise quantized full" "tensorwise quantized fp8" "bf16 high_precision full" "bf16 high_precision fp8"; do
  set -- $cfg
  echo "-- train 1b: recipe $1, backward $2, saved activations $3"
  $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 4 --eval-batches 0 --sample-tokens 0 --no-save \
    --recipe $1 --backward $2 --saved-activations $3 --out-dir /tmp/runs --name c-$1-$3 > /tmp/t.txt 2>&1 || tail -5 /tmp/t.txt
  steps /tmp/runs/c-$1-$3/metrics.jsonl
done
for cfg in "bf16 high_precision full" "bf16 high_precision fp8" "tensorwise quantized full" "tensorwise quantized fp8" "tensorwise dequantized full" "tensorwise dequantized fp8"; do
  set -- $cfg
  echo "-- default small model: recipe $1, backward $2, saved activations $3"
  $bin train --device cuda --recipe $1 --backward $2 --saved-activations $3 --sample-tokens 0 --no-save \
    --out-dir /tmp/runs --name s-$1-$2-$3 > /tmp/s.txt 2>&1 || tail -5 /tmp/s.txt
  grep -E "^(bf16|i:)" /tmp/s.txt | tail -1
done
