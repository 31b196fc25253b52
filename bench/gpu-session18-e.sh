#!/usr/bin/env bash
# Eighteenth session, last call ($OUT set; carry dev-bin and .whl): issue 4's
# ~1B training figures on this session's binary, beside the PyTorch peers in
# the same call: batch 16 x 2048, 10 steps (median of steps 4-10), bf16 and
# tensorwise alternated twice, then torch.compile bf16 and torchao float8
# tensorwise (bench/peers_train.py) at the same batch.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
for rep in 1 2; do
  for r in bf16 tensorwise; do
    run1b dev-bin/octet train t-$r-$rep 16 10 4 --recipe $r | tee -a $R/train.txt
  done
done
echo "train done ($((SECONDS-t0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_BATCH=16 PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 330 python3 bench/peers_train.py "$R/peers-train-1b-b16.json" 10 2>&1 | grep -E "tok/s|not importable|Error" | tee -a $R/train.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
