#!/usr/bin/env bash
# Where a ~1B LoRA step goes (OCTET_PROFILE phases), FP8 base vs bf16 base, and the
# PyTorch + PEFT peers; run on the lent GPU with $OUT set (the device tool sets it):
#   bash bench/gpu-lora-profile.sh
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"; grep -E "FAIL|Llama LoRA|all .* cases" $OUT/selftest.txt | cut -c1-400
for cfg in "fp8-tensorwise fp8 quantized" "bf16 bf16 high_precision"; do
  set -- $cfg
  echo "-- base $1, compute $2, backward $3 (profiled)"
  OCTET_PROFILE=1 $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name p-$1 2>&1 | grep -A16 "profile over"
done
echo "== PyTorch + PEFT bf16 LoRA peers"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/peft/*.whl 2>&1 | tail -2
PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 bench/peers_lora.py "$OUT/peers-lora-1b.json" 10 2>&1 | grep -E "tok/s|failed|Error" | tail -6
