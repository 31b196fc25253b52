#!/usr/bin/env bash
# Twenty-ninth session, call i ($OUT set; carry dev-bin: octet = b1953bf).
# Call h: 16-token shape 4 warps x 3 stages (OCTET_MIXED_TUNE=2:4:3) read
# 0.01-0.02 of copy above the table's 4 x 2 on all six points, one round.
# Three rounds each, M = 9, 12, 16, 32 (selftests of both ran in call h).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
for rep in 1 2 3; do
  for s in table= w4s3=2:4:3; do
    n=${s%%=*} v=${s#*=}
    OCTET_MIXED_TUNE=$v dev-bin/octet bench mixed --device cuda --m 9,12,16,32 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$n-$rep.txt 2>&1
    echo "== $n rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $R/mixed-$n-$rep.txt copy)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
