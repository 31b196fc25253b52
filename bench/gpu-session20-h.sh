#!/usr/bin/env bash
# Twentieth session, final check ($OUT set; carry dev-bin): the selftest of
# the binary after the last refactor (BlockCore; in a second run also the
# LoRA recomputation without the base input's FP8 copy), and one ~1B tensorwise run
# recomputing every block.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
run1b dev-bin/octet train t-tw-all 16 10 4 --recipe tensorwise --recompute | tee -a $R/train.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
