#!/usr/bin/env bash
# Twentieth session, last call ($OUT set; carry dev-bin): the selftest of the
# final binary (new recomputation cases: LoRA with the dequantized backward
# and with the weight-only base product; sharded, resharding with the first
# block recomputed), and one ~1B run with --recompute-blocks 8 as a check.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
grep -E "recomput" $R/selftest.txt | cut -c1-170
run1b dev-bin/octet train t-tw-8 16 10 4 --recipe tensorwise --recompute-blocks 8 | tee -a $R/train.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
