#!/usr/bin/env bash
# One device call (H100, $OUT set): conformance and the ~1B LoRA step, FP8 base
# (quantized backward) and bf16 base.   bash bench/gpu-session6-e.sh
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|fused amax|all .* cases" $OUT/selftest.txt | cut -c1-120
for cfg in "fp8-tensorwise fp8 quantized" "fp8-tensorwise fp8 dequantized" "bf16 bf16 high_precision"; do
  set -- $cfg
  echo "-- base $1, compute $2, backward $3"
  $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
    --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name 1b-$1-$2-$3 > /dev/null 2>&1
  python3 - "$1-$2-$3" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/runs/1b-{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
ms = [1e3 * 8192 / r["tokens_per_s"] for r in rows[2:]]
print(f"   steps 3-8 step ms: median {sorted(ms)[len(ms)//2]:.1f}, min {min(ms):.1f}; peak device {rows[-1]['device_bytes']/2**30:.2f} GiB; final loss {rows[-1]['loss']:.4f}")
PY
done
