#!/usr/bin/env bash
# Thirty-first session, call g ($OUT set; carry dev-bin: octet.gz = HEAD +
# an uncommitted experiment: OCTET_MIXED_L2HINT=64B|128B|256B compiles the
# tiled small-M kernels' code copies as `cp.async.cg...L2::<size>`, asking L2
# to fetch that much around each 16-byte request (each warp's copy is one
# 2 KiB run). Weight-only selftest under each, then bench mixed M = 1, 4, 8,
# 16 on the issue's three weights, two rounds, tiled rows, share of copy.
# Outcome: within 0.01 of plain copies; the experiment was not committed
# (the hint was a `#define MIXED_L2_PREFETCH` in front of mixed.cu).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
for c in 64B 128B 256B; do
  env OCTET_MIXED_L2HINT=$c OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > "$R/selftest-$c.txt" 2>&1
  echo "selftest $c rc=$? ($((SECONDS-t0)) s): $(selftest_counts "$R/selftest-$c.txt")"
done
for rep in 1 2; do
  for c in none 64B 128B 256B; do
    env OCTET_MIXED_L2HINT=$c dev-bin/octet bench mixed --device cuda --m 1,4,8,16 \
      --kn 4096x4096,4096x14336,8192x28672 > "$R/mixed-$c-$rep.txt" 2>&1
    echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s): $(tiled_ratios "$R/mixed-$c-$rep.txt")"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
