#!/usr/bin/env bash
# Twelfth session, second H100 call: the tree as committed (input gradients of
# the o and down projections in bf16, gradients written by their first GEMM
# without zeroing, on top of the first call's changes) against the binary the
# session started from (dev-bin/octet-old), and the PyTorch peers, same call:
# - the selftest of the new binary;
# - the ~1B training step at batch 16 x 2048, 10 steps (bf16; tensorwise
#   quantized with FP8 saved activations), new and old, then torch.compile
#   bf16 and torchao float8 tensorwise at the same batch;
# - the ~1B LoRA step (FP8 base quantized backward FP8 saved; bf16 base), batch 4.
# Run on the lent GPU with $OUT set (carry dev-bin and .whl).
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
$new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-240 | tail -12
. bench/session12_runs.sh
for cfg in "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  for bin in $new $old $new; do
    run1b $bin train t-$(basename $bin)-$1-$2 16 10 4 --recipe $1 --backward $2 --saved-activations $3
  done
done
echo "train done ($((SECONDS-t0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_BATCH=16 PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_train.py "$OUT/peers-train-1b-b16.json" 10 2>&1 | grep -E "tok/s|not importable|Error"
echo "peers done ($((SECONDS-t0)) s)"
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  run1b $new lora l-$1-$3 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
done
echo "done ($((SECONDS-t0)) s)"
