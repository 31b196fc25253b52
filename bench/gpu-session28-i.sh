#!/usr/bin/env bash
# Twenty-eighth session, call i ($OUT set; carry dev-bin: octet = the
# committed decoder with its three add+norm launches through one helper, a
# refactor of the same launches). The full selftest, and decode once.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
grep -a "decode .* model.*SQNR\|FAIL" $R/selftest.txt | sed 's/   */ /g' | tee -a $R/summary.txt
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
  --temperature 0 > $R/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)" | tee -a $R/summary.txt
