#!/usr/bin/env bash
# One device call (H100, $OUT set): conformance, the ~1B training table for every
# recipe and backward mode, and the PyTorch peers in the same call.
#   bash bench/gpu-session6-a.sh
set -uo pipefail
bin=dev-bin/octet
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|amaxes|all .* cases" $OUT/selftest.txt | cut -c1-160
echo "== ~1B Llama (d=2048, 16 layers, 16 heads, MLP 5632), batch 4 x 2048, 6 steps (tokens/s over steps 3-6)"
for rb in "bf16 quantized" "tensorwise quantized" "tensorwise dequantized" "tensorwise high_precision" \
          "rowwise quantized" "blockwise quantized" "delayed quantized" "mxfp8 quantized"; do
  set -- $rb
  $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe $1 --backward $2 --out-dir /tmp/runs --name 1b-$1-$2 2>&1 | grep -E "^(bf16|i:)|peak device|Error|error" | sed "s/^/$1 $2: /" | cut -c1-220
done
echo "== PyTorch peers"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PYTHONUNBUFFERED=1 timeout 200 python3 bench/peers_train.py "$OUT/peers-train-1b.json" 10 2>&1 | grep -E "tok/s|not importable"
