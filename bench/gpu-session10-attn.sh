#!/usr/bin/env bash
# One device call (H100, $OUT set; carry dev-bin and .whl): attention on TMA
# copies. Conformance, `bench attention`, the ~1B training step (bf16 and
# tensorwise; the mma.sync attention beside it), and the PyTorch peers in the
# same call.
set -uo pipefail
bin=dev-bin/octet
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
if [ "${SKIP_SELFTEST:-}" != 1 ]; then
  timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
  grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160
fi
$bin bench attention --device cuda --shapes 4x2048x16x128,1x8192x16x128,4x2048x32x64 2>&1 | grep -E "attention" | cut -c1-140
echo "== ~1B Llama (d=2048, 16 layers, 16 heads, MLP 5632), batch 4 x 2048, 6 steps (tokens/s over steps 3-6)"
run() { # recipe backward [name]
  $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe $1 --backward $2 --out-dir /tmp/runs --name 1b-$1-$2 2>&1 \
    | grep -E "^(bf16|i:)|Error|error" | sed "s/^/$1 $2: /" | cut -c1-200
}
run bf16 high_precision
run tensorwise quantized
run bf16 high_precision
run tensorwise quantized
echo "== PyTorch peers"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PYTHONUNBUFFERED=1 timeout 240 python3 bench/peers_train.py "$OUT/peers-train-1b.json" 10 2>&1 | grep -E "tok/s|not importable"
