#!/usr/bin/env bash
# Seventh session, final device call (H100, $OUT set): conformance, weight-only
# products, Linear and quantize suites, and the ~1B LoRA step whose base runs
# through the weight-only product (--compute bf16) beside the FP8 and bf16 bases.
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160 | head -20
$bin bench mixed --device cuda --json $OUT/mixed.json > $OUT/mixed.txt 2>&1; echo "mixed rc=$?"
grep -E "copy|M=1 |M=4 |M=16 |M=2048" $OUT/mixed.txt | cut -c1-150
$bin bench linear --device cuda --json $OUT/linear.json > $OUT/linear.txt 2>&1; echo "linear rc=$?"
grep -E "linear" $OUT/linear.txt | cut -c1-150
$bin bench quantize --device cuda --json $OUT/quantize.json > $OUT/quantize.txt 2>&1; echo "quantize rc=$?"
grep -E "copy|quantize" $OUT/quantize.txt | cut -c1-150 | head -8
for cfg in "fp8-tensorwise fp8 quantized" "fp8-tensorwise bf16 dequantized" "bf16 bf16 high_precision"; do
  set -- $cfg
  $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
    --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name 1b-$1-$2-$3 > $OUT/lora-$1-$2-$3.txt 2>&1
  python3 - "$1-$2-$3" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/runs/1b-{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
ms = [1e3 * 8192 / r["tokens_per_s"] for r in rows[2:]]
print(f"lora {sys.argv[1]}: steps 3-8 step ms median {sorted(ms)[len(ms)//2]:.1f}, min {min(ms):.1f}; peak {rows[-1]['device_bytes']/2**30:.2f} GiB; final loss {rows[-1]['loss']:.4f}")
PY
done
