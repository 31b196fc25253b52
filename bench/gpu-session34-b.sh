#!/usr/bin/env bash
# Thirty-fourth session, call b ($OUT set; carry dev-bin: octet.gz = 3e8a492
# plus the uncommitted OCTET_MIXED_EXP hook and the ILV experiment). ILV:
# the 16-token kernels over tiled codes issue the next block's copies as
# stepped pieces spread over the eight mma steps (one or two a step) instead
# of a burst of twelve before the wait (SASS: bf16 loop 390 -> 316 at 96
# registers, f16 325 -> 243). Call a: the burst of stepped copies (STEP2)
# doubled the long-scoreboard stalls on 4096x14336 and lost 0.08 there, with
# or without PDL. Weight-only selftest under ILV, three rounds of bench mixed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r34b; mkdir -p $R
{
OCTET_MIXED_EXP=ILV OCTET_SELFTEST_ONLY=mixed timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=ILV rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2 3; do
  for v in base ilv; do
    case $v in
      base) e="X=1";;
      ilv) e="OCTET_MIXED_EXP=ILV";;
    esac
    env $e timeout 120 dev-bin/octet bench mixed --device cuda --m 12,16,32,64 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
