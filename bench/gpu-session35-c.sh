#!/usr/bin/env bash
# Thirty-fifth session, call c ($OUT set; carry dev-bin: octet.gz = a0d6f0a
# plus the review's numerics fixes, uncommitted): stochastic rounding far
# below the smallest subnormal (nvfp4.cu e2m1_encode), the NVFP4 block
# multiplier capped at the largest f32, delayed scaling keeping its scale
# while an inf or NaN amax is in the window (delayed.cu). The full selftest,
# whose NVFP4 and delayed cases now include a tensor near 1e-36 and an inf
# and a NaN amax.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r35c; mkdir -p $R
{
timeout 560 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10
grep -a "nvfp4\|delayed scaling on" $R/selftest.txt | head -30
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
