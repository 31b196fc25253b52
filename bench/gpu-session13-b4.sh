#!/usr/bin/env bash
# Thirteenth session, last H100 call ($OUT set; carry dev-bin and .whl): the
# final binary at batch 4 x 2048 (issue 4's targets at the smaller batch):
# bf16 and tensorwise quantized with FP8 saved activations, twice each, then
# the PyTorch peers (torch.compile bf16, torchao float8) at batch 4.
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
. bench/session12_runs.sh
for cfg in "bf16 high_precision full" "tensorwise quantized fp8" "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  run1b $new train b4-$1-$2 4 12 4 --recipe $1 --backward $2 --saved-activations $3
done
echo "train done ($((SECONDS-t0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_BATCH=4 PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_train.py "$OUT/peers-train-1b-b4.json" 12 2>&1 | grep -E "tok/s|not importable|Error"
echo "done ($((SECONDS-t0)) s)"
