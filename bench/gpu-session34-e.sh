#!/usr/bin/env bash
# Thirty-fourth session, call e ($OUT set; carry dev-bin: octet.gz = 3e8a492
# plus the uncommitted OCTET_MIXED_EXP hook and the MIXCONV experiment).
# MIXCONV: in the 16-token bf16 kernels (E4M3), half the pairs of codes go
# through the integer conversion (PRMT, shift, LOP3, HMUL2.BF16) and half
# through the FP8 instructions (F2FP, two HADD2.F32, F2FP), spreading the
# conversions over more pipes; same 390-instruction loop. Session 33 timed it
# only against a broken baseline. OCTET_FP8_CONVERT=soft (every pair by the
# integer path) for reference. Selftest under MIXCONV, three rounds.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r34e; mkdir -p $R
{
OCTET_MIXED_EXP=MIXCONV OCTET_SELFTEST_ONLY=mixed timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=MIXCONV rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2 3; do
  for v in base mixconv soft; do
    case $v in
      base) e="X=1";;
      mixconv) e="OCTET_MIXED_EXP=MIXCONV";;
      soft) e="OCTET_FP8_CONVERT=soft";;
    esac
    env $e timeout 120 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
