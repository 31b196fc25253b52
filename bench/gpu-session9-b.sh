#!/usr/bin/env bash
# One device call (H100, $OUT set; carry dev-bin and .whl): conformance, ~1B
# training (bf16, tensorwise) and the ~1B LoRA step with the wgmma attention and
# row-blocked RoPE, and the PyTorch training peers in the same call.
set -uo pipefail
bin=dev-bin/octet
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160
echo "== ~1B Llama, batch 4 x 2048, 6 steps (tokens/s over steps 3-6)"
for rb in "bf16 high_precision" "tensorwise quantized"; do
  set -- $rb
  $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe $1 --backward $2 --out-dir /tmp/runs --name 1b-$1-$2 2>&1 | grep -E "^(bf16|i:)|Error|error" | sed "s/^/$1 $2: /" | cut -c1-200
done
echo "== PyTorch peers"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PYTHONUNBUFFERED=1 timeout 240 python3 bench/peers_train.py "$OUT/peers-train-1b.json" 10 2>&1 | grep -E "tok/s|not importable"
SKIP_PEERS=1 bash bench/gpu-lora.sh $OUT/lora 1b 2>&1 | grep -E "^--|steps 3-8"
