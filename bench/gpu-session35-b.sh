#!/usr/bin/env bash
# Thirty-fifth session, call b ($OUT set; carry dev-bin: octet.gz = call a's
# build with ALLC's per-warp regions rounded to 16 bytes). Call a's selftest
# failed with a misaligned address: with an odd number of blocks a warp, the
# next warp's region (and its bulk copies) sat 8 bytes off 16. The timed
# shapes (K = 4096, eight blocks a warp) were aligned. Here: the weight-only
# selftest with all three experiments, then each alone.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r35b; mkdir -p $R
{
for e in ALLC,ACC2,XCA ACC2 XCA; do
  OCTET_MIXED_EXP=$e OCTET_SELFTEST_ONLY=mixed timeout 150 dev-bin/octet selftest --device cuda > $R/selftest-$e.txt 2>&1
  echo "selftest exp=$e rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-$e.txt)"
  grep -a FAIL $R/selftest-$e.txt | head -5
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
