#!/usr/bin/env bash
# Twenty-seventh session, call c ($OUT set; carry dev-bin: HEAD 92ee738):
# is the 16-token kernel's shortfall on 4096x14336 the partial last wave?
# It runs 896 blocks of 16 rows at 4 blocks an SM (528 resident on 132 SMs),
# 1.70 waves. `bench mixed --m 8,16` over weights of K = 4096 whose row
# tiles fill 1.00, 1.50, 1.70, 2.00, 2.06, 3.00 waves of the 16-token kernel,
# and 8192x28672 (3.39), twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
for rep in 1 2; do
  dev-bin/octet bench mixed --device cuda --m 8,16 \
    --kn 4096x8448,4096x12672,4096x14336,4096x16896,4096x17408,4096x25344,8192x28672 > $T/waves-$rep.txt 2>&1
  echo "== rep $rep rc=$? ($((SECONDS-t0)) s)"
  mixed_ratios $T/waves-$rep.txt copy
done | tee $R/summary.txt
cp $T/waves-2.txt $R/waves-2.txt
echo "done ($((SECONDS-t0)) s)"
