#!/usr/bin/env bash
# Twenty-second session, ninth call ($OUT set; carry dev-bin = HEAD after the
# review's run_layer helper, which changes selftest code only):
# `octet selftest --device cuda`.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
grep -E "LoRA layer" $R/selftest.txt | sed 's/   */ /g' | cut -c1-200
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
