#!/usr/bin/env bash
# Thirty-second session, call h ($OUT set; carry dev-bin: octet.gz = 446abfc
# plus an uncommitted OCTET_MIXED_EXP=step2, which compiles the
# OCTET_MIXED_TUNE shape with the stepped copies for two token groups too).
# Call c found them +0.03 on 4096x4096 and worse on the larger weights; the
# few-block rule (at most two blocks an SM, as SMALL_F16_FEW) would give them
# to 4096x4096 alone. Do they reach 0.85 there with 4 or 6 warps? The
# weight-only selftest under 2:6:3 step2, then two rounds.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
OCTET_MIXED_TUNE=2:6:3 OCTET_MIXED_EXP=step2 OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest 2:6:3 step2 rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2; do
  for v in table 2-4-3-step2 2-6-3-step2 2-6-3; do
    case $v in
      table) e="X=1";;
      2-4-3-step2) e="OCTET_MIXED_TUNE=2:4:3 OCTET_MIXED_EXP=step2";;
      2-6-3-step2) e="OCTET_MIXED_TUNE=2:6:3 OCTET_MIXED_EXP=step2";;
      2-6-3) e="OCTET_MIXED_TUNE=2:6:3";;
    esac
    env $e dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
