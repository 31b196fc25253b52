#!/usr/bin/env bash
# Nineteenth session ($OUT set; carry dev-bin): the small-M weight-only
# kernel from 9 tokens on with x converted to f16 (a power of two a token
# row) so that each pair of codes takes one conversion, against the bf16
# path (OCTET_MIXED_F16=0) in the same binary: selftest, then `octet bench
# mixed` at M = 1, 4, 8, 16, 32 on the three weights, f16 path and bf16
# path alternated twice. (The f16 path was reverted after this call, commit
# 088d8a9: with later binaries OCTET_MIXED_F16 does nothing.)
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
grep -E "2\^-110" $R/selftest.txt | sed 's/   */ /g'
for rep in 1 2; do
  for f16 in 1 0; do
    OCTET_MIXED_F16=$f16 dev-bin/octet bench mixed --device cuda --m 8,16,32 --kn 4096x4096,4096x14336,8192x28672 \
      > $R/mixed-f16_$f16-$rep.txt 2>&1
    echo "== f16=$f16 rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "graph, vs the same-size copy" $R/mixed-f16_$f16-$rep.txt | sed 's/   */ /g' | cut -c1-220
  done
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
