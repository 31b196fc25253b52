#!/usr/bin/env bash
# Thirty-second session, call f ($OUT set; carry dev-bin: octet.gz = 26cef7a
# plus the uncommitted `mixed_mid_m`, now with its codes six blocks ahead
# (their own ring) and x one (OCTET_MIXED_MID_XST=3: two) ahead; call e's
# version kept both one block ahead and lost to groups of 16). Weight-only
# selftest for each ring, then bench mixed at M = 16-64 against
# OCTET_MIXED_MID=0, two rounds.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
for xst in 2 3; do
  OCTET_MIXED_MID_XST=$xst OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-xst$xst.txt 2>&1
  echo "selftest xst $xst rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-xst$xst.txt)"
  grep -a FAIL $R/selftest-xst$xst.txt | head -5
done
for rep in 1 2; do
  for v in xst2 xst3 mid0; do
    case $v in xst2) e="OCTET_MIXED_MID_XST=2";; xst3) e="OCTET_MIXED_MID_XST=3";; mid0) e="OCTET_MIXED_MID=0";; esac
    env $e dev-bin/octet bench mixed --device cuda --m 17,32,48,64 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s)"
    echo "   bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt)"
    echo "   f16 x:  $(f16_ratios $R/mixed-$v-$rep.txt)"
    grep -E "^gemm.*M=(32|64), [0-9]+ weights back to back" $R/mixed-$v-$rep.txt | sed 's/   */ /g' | awk '{print $4 $5, $6, $(NF-2)}' | paste -sd' '
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
