#!/usr/bin/env bash
# Nineteenth session ($OUT set; carry .whl with peft): what LoRA dropout costs
# PyTorch + PEFT on the ~1B model (batch 4 x 2048, r 16, all seven), eager
# and compiled, at lora_dropout 0 and 0.1, beside octet's +6.5 ms
# (bench/gpu-session19-f.sh).
set -uo pipefail
t0=$SECONDS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/peft/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site
PEERS_LORA_DROPOUTS=0,0.1 PYTHONUNBUFFERED=1 timeout 540 python3 bench/peers_lora.py $OUT/peers-lora-dropout.json 10 2>&1 | grep -vE "^\s*$|Warning|warn" | tail -12
echo "done ($((SECONDS-t0)) s)"
