#!/usr/bin/env bash
# The GPU checks and measurements of the training path, in one call on the lent
# GPU machine, with a binary built on the CPU machine (dev-bin/octet):
#   bench/gpu-final.sh OUT_DIR
# Writes OUT_DIR/log.txt (everything printed), selftest.txt, compare.json and
# compare.png (recipes on the small model), peers-train-1b.json.
set -uo pipefail
out="${1:?output directory}"
bin=dev-bin/octet
mkdir -p "$out"
exec > >(tee "$out/log.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
echo "== selftest"
$bin selftest --device cuda > "$out/selftest.txt" 2>&1; echo "selftest rc=$?"
grep -E "FAIL|attention|Llama|AdamW|all .* cases" "$out/selftest.txt"
echo "== every recipe on the small model (the README default), GPU"
$bin compare --device cuda --out-dir /tmp/cmp --name gpu \
  --recipes bf16,delayed,tensorwise,rowwise,blockwise,mxfp8,nvfp4 | grep -v "^\s*$"
cp /tmp/cmp/gpu-compare.json /tmp/cmp/gpu-compare.png "$out/" 2>/dev/null
echo "== resume on the GPU: 20 steps vs 10 + resumed 10 (tiny model, tensorwise)"
common="--device cuda --model tiny --steps 20 --batch 8 --seq 64 --eval-batches 0 --sample-tokens 0 --out-dir /tmp/res"
$bin train $common --name a --ckpt-every 10 > /dev/null 2>&1
$bin train $common --name b --resume /tmp/res/a/checkpoints/step_000010 > /dev/null 2>&1
python3 - <<'PY'
import json
a = [json.loads(l) for l in open("/tmp/res/a/metrics.jsonl") if '"loss"' in l]
b = [json.loads(l) for l in open("/tmp/res/b/metrics.jsonl") if '"loss"' in l]
la = {r["step"]: r["loss"] for r in a}
lb = {r["step"]: r["loss"] for r in b}
same = [s for s in lb if s in la and la[s] == lb[s]]
print(f"resumed steps {sorted(lb)}: {len(same)} of {len(lb)} losses bit-identical to the uninterrupted run")
for s in sorted(lb):
    print(s, la.get(s), lb[s])
PY
echo "== ~1B Llama (d=2048, 16 layers, 16 heads, MLP 5632), batch 4 x 2048, 6 steps (tokens/s over steps 3-6)"
for rb in "bf16 quantized" "tensorwise quantized" "tensorwise dequantized" "tensorwise high_precision" \
          "rowwise quantized" "blockwise quantized" "delayed quantized" "mxfp8 quantized"; do
  set -- $rb
  $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe $1 --backward $2 --out-dir /tmp/runs --name 1b-$1-$2 2>&1 | grep -E "^(bf16|i:)|peak device|Error|error" | sed "s/^/$1 $2: /"
done
echo "== PyTorch peers"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
PYTHONUNBUFFERED=1 python3 bench/peers_train.py "$out/peers-train-1b.json" 10 2>&1 | grep -E "tok/s|not importable"
