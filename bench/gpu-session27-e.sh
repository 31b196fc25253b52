#!/usr/bin/env bash
# Twenty-seventh session, call e ($OUT set; carry dev-bin: octet = HEAD plus
# small-M kernel variants, OCTET_MIXED_N{4,8,16}=wWsS): call c found the
# 16-token kernel's share of copy set by how full its last wave is. Other
# warps x stages change the blocks an SM, hence the waves of each weight.
# 1. the weight-only selftest cases with one variant of each token group;
# 2. `bench mixed` on the issue's three weights, every variant of each token
#    group in turn (M = 12,16; 5,8; 1,4), two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
OCTET_MIXED_N16=w2s2 OCTET_MIXED_N8=w4s2 OCTET_MIXED_N4=w4s3 OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest \
  --device cuda > $R/selftest-variants.txt 2>&1
echo "selftest variants rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-variants.txt)" | tee $R/summary.txt
KN=4096x4096,4096x14336,8192x28672
for rep in 1 2; do
  for v in default w2s2 w2s3 w2s4 w8s2 w4s3; do
    if [ $v = default ]; then unset OCTET_MIXED_N16; else export OCTET_MIXED_N16=$v; fi
    dev-bin/octet bench mixed --device cuda --m 12,16 --kn $KN > $T/n16-$v.txt 2>&1
    echo "== n16 $v rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/n16-$v.txt copy)"
  done
  unset OCTET_MIXED_N16
  for v in default w4s2 w4s3 w8s3; do
    if [ $v = default ]; then unset OCTET_MIXED_N8; else export OCTET_MIXED_N8=$v; fi
    dev-bin/octet bench mixed --device cuda --m 5,8 --kn $KN > $T/n8-$v.txt 2>&1
    echo "== n8 $v rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/n8-$v.txt copy)"
  done
  unset OCTET_MIXED_N8
  for v in default w8s2 w4s3 w4s4; do
    if [ $v = default ]; then unset OCTET_MIXED_N4; else export OCTET_MIXED_N4=$v; fi
    dev-bin/octet bench mixed --device cuda --m 1,4 --kn $KN > $T/n4-$v.txt 2>&1
    echo "== n4 $v rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/n4-$v.txt copy)"
  done
  unset OCTET_MIXED_N4
done | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
