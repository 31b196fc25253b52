#!/usr/bin/env bash
# Thirty-first session, call c ($OUT set; carry dev-bin: octet.gz = e30c96a,
# tiled codes). The small-M table (warps x stages per token group) was swept
# on row-major codes; tiled copies issue fewer instructions and read runs of
# 2 KiB, which may move the best shape. OCTET_MIXED_TUNE (no rebuild) for
# the 16-token group (M = 12, 16) and the up-to-4 group (M = 1, 4), the
# weight-only selftest under each, bench mixed two rounds, tiled rows only,
# share of the 1 GiB copy.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
sweep() { # GROUP_CFGS M_LIST
  local cfgs=$1 ms=$2 c rep
  for c in $cfgs; do
    [ "$c" = table ] && continue
    env OCTET_MIXED_TUNE=$c OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > "$R/selftest-$c.txt" 2>&1
    echo "selftest $c rc=$? ($((SECONDS-t0)) s): $(selftest_counts "$R/selftest-$c.txt")"
  done
  for rep in 1 2; do
    for c in $cfgs; do
      env OCTET_MIXED_TUNE=$c dev-bin/octet bench mixed --device cuda --m $ms \
        --kn 4096x4096,4096x14336,8192x28672 > "$R/mixed-$c-$rep.txt" 2>&1
      echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s): $(tiled_ratios "$R/mixed-$c-$rep.txt")"
    done
  done
}
{
sweep "table 2:8:2 2:8:3 2:4:4 2:6:3 2:2:4" 12,16
sweep "table 1:8:4 1:4:4 1:16:2 1:12:3" 1,4
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
