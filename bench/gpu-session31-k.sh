#!/usr/bin/env bash
# Thirty-first session, call k ($OUT set; carry dev-bin: octet.gz = HEAD
# c5fd2b3). The full selftest, then bench mixed at every M the issue's
# targets name (1, 2, 4, 8, 12, 16 and 2048) on its three weights, one round.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
dev-bin/octet bench mixed --device cuda --m 1,2,4,8,12,16,2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed.txt 2>&1
echo "bench mixed rc=$? ($((SECONDS-t0)) s): $(tiled_vs_row $R/mixed.txt)"
grep -E "^(mixed|gemm).*M=2048" $R/mixed.txt | sed 's/   */ /g' | cut -c1-120
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
