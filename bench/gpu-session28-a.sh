#!/usr/bin/env bash
# Twenty-eighth session, call a ($OUT set; carry dev-bin: octet = HEAD 158e0c1
# plus small-M variants chosen by OCTET_MIXED_N{4,8,16}=wWsS). Call e of the
# twenty-seventh session timed these shapes before the spread rule, when a
# shape's shared memory also set how unevenly a small launch landed; under
# the rule each SM holds at most ceil(blocks / SMs) anyway.
# 1. the weight-only selftest cases with each variant;
# 2. `bench mixed` on the issue's three weights, each token group's variants
#    in turn (M = 12,16; 5,8; 1,4 plus the ~1B model's weights), two rounds;
# 3. decode with the 4-token variants.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
for set in "w4s3 w8s3 w8s4" "w4s4 w4s4 w8s2" "w2s4 w8s2 w6s3"; do
  read a b c <<< "$set"
  OCTET_MIXED_N16=$a OCTET_MIXED_N8=$b OCTET_MIXED_N4=$c OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest \
    --device cuda > $T/selftest.txt 2>&1
  echo "selftest n16=$a n8=$b n4=$c rc=$? ($((SECONDS-t0)) s): $(selftest_counts $T/selftest.txt)"
done | tee $R/summary.txt
KN=4096x4096,4096x14336,8192x28672
for rep in 1 2; do
  for v in default w4s3 w4s4 w2s4; do
    if [ $v = default ]; then unset OCTET_MIXED_N16; else export OCTET_MIXED_N16=$v; fi
    dev-bin/octet bench mixed --device cuda --m 12,16 --kn $KN > $T/n16.txt 2>&1
    echo "== n16 $v rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/n16.txt copy)"
  done
  unset OCTET_MIXED_N16
  for v in default w8s3 w4s4; do
    if [ $v = default ]; then unset OCTET_MIXED_N8; else export OCTET_MIXED_N8=$v; fi
    dev-bin/octet bench mixed --device cuda --m 5,8 --kn $KN > $T/n8.txt 2>&1
    echo "== n8 $v rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/n8.txt copy)"
  done
  unset OCTET_MIXED_N8
  for v in default w8s4 w8s2 w6s3; do
    if [ $v = default ]; then unset OCTET_MIXED_N4; else export OCTET_MIXED_N4=$v; fi
    dev-bin/octet bench mixed --device cuda --m 1,4 --kn $KN,2048x5632,5632x2048 > $T/n4.txt 2>&1
    echo "== n4 $v rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/n4.txt copy)"
  done
  unset OCTET_MIXED_N4
done | tee -a $R/summary.txt
for v in default w8s4 default w8s4; do
  if [ $v = default ]; then unset OCTET_MIXED_N4; else export OCTET_MIXED_N4=$v; fi
  dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 \
    --max-tokens 256 --temperature 0 > $T/generate.txt 2>&1
  echo "generate n4=$v rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
done | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
