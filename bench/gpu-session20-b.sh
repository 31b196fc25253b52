#!/usr/bin/env bash
# Twentieth session, second call ($OUT set; carry dev-bin and .whl): the
# recomputation without the down projection's product; the selftest, the ~1B
# model at batch 16 with and without --recompute (bf16, tensorwise), then
# PyTorch 2.11 with activation checkpointing of every block
# (PEERS_CHECKPOINT=1: torch.compile bf16, torchao float8) at the same batch.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
grep -E "recomputation|recomputing" $R/selftest.txt | cut -c1-160 | tee $R/recompute-cases.txt
for r in bf16 tensorwise; do
  for rc in "" --recompute; do
    run1b dev-bin/octet train t-$r$rc 16 10 4 --recipe $r $rc | tee -a $R/train.txt
  done
done
echo "octet done ($((SECONDS-t0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/torchao*.whl && export PYTHONPATH=/tmp/site
PEERS_CHECKPOINT=1 PEERS_BATCH=16 PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_train.py "$R/peers-train-1b-b16-checkpoint.json" 10 2>&1 | grep -E "tok/s|not importable|Error" | tee -a $R/train.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
