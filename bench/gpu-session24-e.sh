#!/usr/bin/env bash
# Twenty-fourth session, fifth call ($OUT set; carry dev-bin): blocks of two
# 16-row tiles sharing each x tile (half the x bytes per weight byte through
# L2 and shared memory) for 9-16 tokens (and 5-8), against the committed
# shapes. `OCTET_MIXED_SMALL=TAG8,TAG16` swapped the kernels for this call
# only. Mixed selftest cases under each, then `octet bench mixed` at M = 8,
# 12, 16 on the three weights, in turn, twice.
set -uo pipefail
t0=$SECONDS
R=$OUT/r
mkdir -p $R
cfgs="n8,n16 n8,n16w4s2r2 n8,n16w2s3r2 n8,n16w2s2r2 n8,n16w4s3r2 n8w8s2r2,n16"
for c in $cfgs; do
  OCTET_MIXED_SMALL=$c OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-$c.txt 2>&1
  echo "selftest $c rc=$? ($((SECONDS-t0)) s): $(grep -cE '\bpass\b' $R/selftest-$c.txt) pass, $(grep -c FAIL $R/selftest-$c.txt) FAIL"
done
for rep in 1 2; do
  for c in $cfgs; do
    OCTET_MIXED_SMALL=$c dev-bin/octet bench mixed --device cuda --m 8,12,16 \
      --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$c-$rep.txt 2>&1
    echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "[0-9] weights back to back in a graph" $R/mixed-$c-$rep.txt | grep "^mixed" | sed 's/   */ /g' | awk '{print $5 $6, $7, $(NF-1)}' | sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
  done
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
# Slower everywhere (BENCHMARKS.md); the two-row-tile kernels were removed after this call.
