#!/usr/bin/env bash
# Nineteenth session, third call ($OUT set; carry dev-bin and .whl): the
# input gradients of projections that read one input (q, k, v; gate, up)
# summed in a bf16 buffer instead of f32 (dev-bin/octet) against the
# binary before (dev-bin/octet-old), ~1B at batch 16 x 2048, bf16 and
# tensorwise alternated; the selftest on the new binary; then torch.compile
# bf16 and torchao float8 (bench/peers_train.py) at the same batch.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    for r in bf16 tensorwise; do
      run1b dev-bin/$bin train t-$bin-$r-$rep 16 10 4 --recipe $r | tee -a $R/train.txt
    done
  done
done
echo "train done ($((SECONDS-t0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_BATCH=16 PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_train.py "$R/peers-train-1b-b16.json" 10 2>&1 | grep -E "tok/s|not importable|Error" | tee -a $R/train.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
