#!/usr/bin/env bash
# Thirty-first session, call f ($OUT set; carry dev-bin: octet.gz = the review commit,
# tiled codes). Three warps a block, not swept before: at 16 tokens 3 x 3
# needs 55 KiB a block, so four blocks fit an SM (three at 4 x 3), and
# 4096x14336's 896 row tiles fill 1.70 waves instead of 2.26. Also 3 x 4 and
# 5 x 2. Weight-only selftest under each, bench mixed M = 12, 16, two rounds.
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
sweep "table 2:3:3 2:3:4 2:5:2" 12,16
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
