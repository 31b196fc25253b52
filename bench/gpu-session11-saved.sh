#!/usr/bin/env bash
# FP8 saved activations (`--saved-activations fp8`), eleventh session: selftest,
# then the ~1B LoRA step and training step with full vs FP8 saved activations.
# Run on the lent GPU with $OUT set: bash bench/gpu-session11-saved.sh [lora|train|all]
set -uo pipefail
bin=dev-bin/octet
what="${1:-all}"
summary() {  # metrics.jsonl -> step ms (median of steps 3..), peak device, saved
  python3 - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
ms = sorted(1e3 * 8192 / r["tokens_per_s"] for r in rows[2:])
print(f"   step ms median {ms[len(ms)//2]:.1f} (min {ms[0]:.1f}); peak device {max(r['device_bytes'] for r in rows)/2**30:.2f} GiB; saved {rows[-1]['saved_bytes']/2**30:.2f} GiB; loss at step {rows[-1]['step']} {rows[-1]['loss']:.4f}")
PY
}
if [ "${SKIP_SELFTEST:-}" != 1 ]; then
  $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
  grep -E "FAIL|saved activations|all .* cases" $OUT/selftest.txt | cut -c1-420
fi
if [ "$what" = lora ] || [ "$what" = all ]; then
  for cfg in "fp8-tensorwise fp8 dequantized fp8" "fp8-tensorwise fp8 dequantized full" "bf16 bf16 high_precision full" "bf16 bf16 dequantized fp8"; do
    set -- $cfg
    echo "-- lora 1b: base $1, compute $2, backward $3, saved activations $4"
    $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --saved-activations $4 --out-dir /tmp/runs --name l-$1-$3-$4 > /tmp/l.txt 2>&1 || tail -5 /tmp/l.txt
    summary /tmp/runs/l-$1-$3-$4/metrics.jsonl
  done
fi
if [ "$what" = train ] || [ "$what" = all ]; then
  for cfg in "bf16 high_precision full 4" "tensorwise quantized full 4" "tensorwise quantized fp8 4" "tensorwise dequantized fp8 4"; do
    set -- $cfg
    echo "-- train 1b: recipe $1, backward $2, saved activations $3, batch $4 x 2048"
    $bin train --device cuda --model 1b --batch $4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 --no-save \
      --recipe $1 --backward $2 --saved-activations $3 --out-dir /tmp/runs --name t-$1-$2-$3-$4 > /tmp/t.txt 2>&1 || tail -5 /tmp/t.txt
    summary /tmp/runs/t-$1-$2-$3-$4/metrics.jsonl
  done
fi
