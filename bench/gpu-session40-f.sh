#!/usr/bin/env bash
# Fortieth session, call f, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD).
# Call e's selftest stopped at a case of its own making (a SwiGLU width not a
# multiple of 8); with it mended: the full selftest, and the weight-only one
# with integer FP8 conversions.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
R=$OUT
{
timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3 | cut -c1-300)"
grep -a -E 'ff=4232|ff 4232|4232' $R/selftest.txt | sed 's/   */ /g' | head -4 | cut -c1-200
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed timeout 120 dev-bin/octet selftest --device cuda > $R/selftest-soft.txt 2>&1
echo "soft mixed selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-soft.txt | head -3 | cut -c1-300)"
gzip -9 $R/selftest*.txt
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
