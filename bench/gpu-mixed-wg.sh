#!/usr/bin/env bash
# One device call (H100, $OUT set; carry dev-bin): the weight-only wgmma kernel
# for M > 64 (issue 6). Conformance (mixed cases), `bench mixed` with the
# wgmma kernel and with the upcast + cuBLASLt path it replaces
# (OCTET_MIXED=upcast), and the ~1B LoRA step whose base products are
# weight-only (`--compute bf16`), both ways.
set -uo pipefail
bin=dev-bin/octet
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160
grep -E "mixed .* m=(300|520)" $OUT/selftest.txt | cut -c1-160 | head -40
for path in wgmma upcast; do
  echo "== bench mixed ($path)"
  env $( [ $path = upcast ] && echo OCTET_MIXED=upcast ) $bin bench mixed --device cuda --m 1,16,256,2048 \
    --json $OUT/mixed-$path.json > $OUT/mixed-$path.txt 2>&1; echo "rc=$?"
  grep -E "M=(256|2048)|copy" $OUT/mixed-$path.txt | cut -c1-150
  echo "== bench mixed ($path), the ~1B model's projections at batch 4 x 2048"
  env $( [ $path = upcast ] && echo OCTET_MIXED=upcast ) $bin bench mixed --device cuda --m 8192 \
    --kn 2048x2048,2048x5632,5632x2048 --json $OUT/mixed-1b-$path.json 2>&1 | grep -E "M=" | cut -c1-150
done
echo "== ~1B LoRA step, fp8-tensorwise base, --compute bf16 (weight-only base products), dequantized"
for path in wgmma upcast; do
  env $( [ $path = upcast ] && echo OCTET_MIXED=upcast ) $bin lora --device cuda --model 1b --batch 4 --seq 2048 \
    --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --base-format fp8-tensorwise --compute bf16 \
    --backward dequantized --out-dir /tmp/runs --name 1b-$path > $OUT/lora-$path.txt 2>&1; echo "rc=$?"
  python3 - "$path" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/runs/1b-{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
ms = [1e3 * 8192 / r["tokens_per_s"] for r in rows[2:]]
print(f"[{sys.argv[1]}] steps 3-8 step ms: median {sorted(ms)[len(ms)//2]:.1f}, min {min(ms):.1f}; peak device {rows[-1]['device_bytes']/2**30:.2f} GiB; losses {[round(r['loss'],4) for r in rows]}")
PY
done
