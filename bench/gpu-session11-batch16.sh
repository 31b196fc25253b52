#!/usr/bin/env bash
# The ~1B training step at batch 16 x 2048 (10 steps): octet bf16, tensorwise
# (full and FP8 saved activations), tensorwise dequantized with FP8 saved
# activations, and the PyTorch peers (torch.compile bf16, torchao float8
# tensorwise compiled) at the same batch in the same call.
# Run on the lent GPU with $OUT set (carry dev-bin and .whl): bash bench/gpu-session11-batch16.sh
set -uo pipefail
bin=dev-bin/octet
bs=${BATCH:-16}
summary() { python3 bench/metrics_summary.py "$1" "${2:-8192}" 4; }
for cfg in "bf16 high_precision full" "tensorwise quantized full" "tensorwise quantized fp8" "tensorwise dequantized fp8" "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  echo "-- octet train 1b: recipe $1, backward $2, saved activations $3, batch $bs x 2048"
  $bin train --device cuda --model 1b --batch $bs --seq 2048 --steps 10 --eval-batches 0 --sample-tokens 0 --no-save \
    --recipe $1 --backward $2 --saved-activations $3 --out-dir /tmp/runs --name b-$1-$2-$3 > /tmp/t.txt 2>&1 || tail -5 /tmp/t.txt
  summary /tmp/runs/b-$1-$2-$3/metrics.jsonl $((bs * 2048))
done
echo "== PyTorch peers, batch $bs x 2048 (tokens/s over steps 4-10, peak allocated)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_BATCH=$bs PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 400 python3 bench/peers_train.py "$OUT/peers-train-1b-b$bs.json" 10 2>&1 | grep -E "tok/s|not importable|Error"
