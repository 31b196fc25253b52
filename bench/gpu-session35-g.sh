#!/usr/bin/env bash
# Thirty-fifth session, call g ($OUT set; carry dev-bin: octet.gz = the review mend: GpuLlama::forward sets the linears' recording from keep itself, no wrapper):
# the layer review's fixes. GpuLlama::forward with keep = false (evaluation)
# no longer records amaxes into the delayed-scaling histories. The full
# selftest (new case: evaluation forwards between steps leave the histories
# and scales as they were), then the trainer smoke test of call e again.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r35g; mkdir -p $R
{
timeout 400 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10
grep -a "evaluation forwards" $R/selftest.txt | tr -s ' ' | cut -c1-250
O=$R/runs
timeout 150 dev-bin/octet train --device cuda --model tiny --recipe delayed --steps 6 --eval-every 2 --eval-batches 2 --out-dir $O --name del > $R/del.txt 2>&1
echo "train delayed rc=$? ($((SECONDS-t0)) s): $(tail -3 $R/del.txt | tr -s ' ' | paste -sd' ')"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
