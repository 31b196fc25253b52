#!/usr/bin/env bash
# Thirty-third session, call f ($OUT set; carry dev-bin: octet.gz = the
# review commit after a70f1cd: MixedKernels::load builds its kernel arrays
# through per_x / per_fmt, same names). Every kernel still loads: the
# weight-only selftest, and one bench under OCTET_MIXED_TUNE (the tune path).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r33f; mkdir -p $R
{
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest mixed rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
OCTET_MIXED_TUNE=2:4:3 dev-bin/octet bench mixed --device cuda --m 16 --kn 4096x4096 > $R/tune.txt 2>&1
echo "bench tune 2:4:3 rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/tune.txt) | f16 x: $(f16_ratios $R/tune.txt)"
tail -3 $R/tune.txt
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
