#!/usr/bin/env bash
# Thirty-sixth session, call c ($OUT set; carry dev-bin: octet.gz = HEAD fc2c761
# plus the mend of call b's failure). Call b's selftest stopped the FP8
# conversion group: `every_code_product` builds a weight of every code, and
# `Fp8Weight` now refuses E5M2's infinite codes. The same function is the probe
# that opens the GPU under integer conversions (Ampere, or
# OCTET_FP8_CONVERT=soft), so it would have refused every such GPU. It now
# zeroes the infinities as it zeroes NaN codes. The full selftest, then the
# weight-only selftest under OCTET_FP8_CONVERT=soft (the probe runs on open).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r36c; mkdir -p $R
{
timeout 400 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -E "delayed scaling on the device|every finite e5m2 code" $R/selftest.txt | tr -s ' ' | cut -c1-250
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed timeout 300 dev-bin/octet selftest --device cuda > $R/soft.txt 2>&1
echo "soft mixed selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/soft.txt)"
grep -a FAIL $R/soft.txt | head -5 | cut -c1-300
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
gzip -c $R/soft.txt > $OUT/soft.txt.gz
