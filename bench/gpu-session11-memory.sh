#!/usr/bin/env bash
# Peak memory with FP8 saved activations, eleventh session: the ~1B LoRA step
# (8 steps) and the ~1B training step at batch 4, 8 and 16 x 2048, full vs
# FP8 saved activations. Peak device = driver's used memory (pool included);
# peak allocated = the memory pool's high-water mark.
# Run on the lent GPU with $OUT set: bash bench/gpu-session11-memory.sh [lora|train|all]
set -uo pipefail
bin=dev-bin/octet
what="${1:-all}"
summary() {  # metrics.jsonl, tokens a step
  python3 - "$1" "$2" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tok = int(sys.argv[2])
ms = sorted(1e3 * tok / r["tokens_per_s"] for r in rows[2:])
dev = [f"{r['device_bytes']/2**30:.2f}" for r in rows]
alloc = max(r.get('allocated_bytes') or 0 for r in rows) / 2**30
print(f"   step ms median {ms[len(ms)//2]:.1f} (min {ms[0]:.1f}); peak device by step {' '.join(dev)} GiB; peak allocated {alloc:.2f} GiB; saved {rows[-1]['saved_bytes']/2**30:.2f} GiB; loss at step {rows[-1]['step']} {rows[-1]['loss']:.4f}")
PY
}
if [ "$what" = lora ] || [ "$what" = all ]; then
  for cfg in "fp8-tensorwise fp8 dequantized fp8" "fp8-tensorwise fp8 quantized fp8" "fp8-tensorwise fp8 dequantized full" "bf16 bf16 high_precision full"; do
    set -- $cfg
    echo "-- lora 1b: base $1, compute $2, backward $3, saved activations $4"
    $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --saved-activations $4 --out-dir /tmp/runs --name l-$1-$3-$4 > /tmp/l.txt 2>&1 || tail -5 /tmp/l.txt
    summary /tmp/runs/l-$1-$3-$4/metrics.jsonl 8192
  done
fi
if [ "$what" = train ] || [ "$what" = all ]; then
  for bs in ${BATCHES:-8 16}; do
    for cfg in "bf16 high_precision full" "tensorwise quantized fp8" "tensorwise dequantized fp8"; do
      set -- $cfg
      echo "-- train 1b: recipe $1, backward $2, saved activations $3, batch $bs x 2048"
      $bin train --device cuda --model 1b --batch $bs --seq 2048 --steps 4 --eval-batches 0 --sample-tokens 0 --no-save \
        --recipe $1 --backward $2 --saved-activations $3 --out-dir /tmp/runs --name t-$1-$2-$3-$bs > /tmp/t.txt 2>&1 || tail -5 /tmp/t.txt
      summary /tmp/runs/t-$1-$2-$3-$bs/metrics.jsonl $((bs * 2048))
    done
  done
fi
