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
summary() { python3 bench/metrics_summary.py "$1" "$2" "$3"; }
for cfg in "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  for b in new old new; do
    bin=$new; [ $b = old ] && bin=$old
    echo "-- $b: train 1b recipe $1 backward $2 saved $3, batch 16"
    $bin train --device cuda --model 1b --batch 16 --seq 2048 --steps 10 --eval-batches 0 --sample-tokens 0 --no-save \
      --recipe $1 --backward $2 --saved-activations $3 --out-dir /tmp/runs --name t-$b-$1-$2 > /tmp/t.txt 2>&1 || tail -5 /tmp/t.txt
    summary /tmp/runs/t-$b-$1-$2/metrics.jsonl 32768 4
  done
done
echo "train done ($((SECONDS-t0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_BATCH=16 PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_train.py "$OUT/peers-train-1b-b16.json" 10 2>&1 | grep -E "tok/s|not importable|Error"
echo "peers done ($((SECONDS-t0)) s)"
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  echo "-- new: lora 1b base $1 compute $2 backward $3 saved $4, batch 4"
  $new lora --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
    --base-format $1 --compute $2 --backward $3 --saved-activations $4 --out-dir /tmp/runs --name l-$1-$3 > /tmp/l.txt 2>&1 || tail -5 /tmp/l.txt
  summary /tmp/runs/l-$1-$3/metrics.jsonl 8192 3
done
echo "done ($((SECONDS-t0)) s)"
