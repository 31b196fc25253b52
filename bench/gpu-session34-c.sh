#!/usr/bin/env bash
# Thirty-fourth session, call c ($OUT set; carry dev-bin: octet.gz = 3e8a492
# plus the uncommitted OCTET_MIXED_EXP hook and the ILV experiment). Call b:
# ILV lost 0.05 at 12-16 tokens (and gained 0.02-0.05 at 32-64). But ILV
# waits for block i before it issues block i + 2's copies, so one block less
# is in flight during the wait than with the burst: here ILV with a fourth
# stage (OCTET_MIXED_TUNE=2:4:4, 96 KiB a block) against the table's 4 x 3,
# and the burst with 4 stages for reference. Three rounds at 12/16 tokens.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r34c; mkdir -p $R
{
OCTET_MIXED_EXP=ILV OCTET_MIXED_TUNE=2:4:4 OCTET_SELFTEST_ONLY=mixed timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=ILV tune=2:4:4 rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2 3; do
  for v in base ilv4 base4; do
    case $v in
      base) e="X=1";;
      ilv4) e="OCTET_MIXED_EXP=ILV OCTET_MIXED_TUNE=2:4:4";;
      base4) e="OCTET_MIXED_TUNE=2:4:4";;
    esac
    env $e timeout 120 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
