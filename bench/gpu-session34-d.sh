#!/usr/bin/env bash
# Thirty-fourth session, call d ($OUT set; carry dev-bin: octet.gz = 3e8a492
# plus the uncommitted OCTET_MIXED_EXP hook and the BULK experiment; the
# host pads x rows to 272 bytes under it). BULK: the 16-token kernels over
# tiled codes fill each ring slot with bulk copies (the TMA unit) that
# complete on an mbarrier: lane 0 the 2 KiB code tile (linear, so 2-way bank
# conflicts on the code reads), lane r < M token r's x row, 272 bytes apart
# (conflict-free reads; the barrier in row 0's pad). No per-lane cp.async
# address arithmetic: bf16 loop 390 -> 338 SASS (the zero-fill of a partial
# last block included, skipped at run time), 66 registers. Weight-only
# selftest under BULK, three rounds of bench mixed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r34d; mkdir -p $R
{
OCTET_MIXED_EXP=BULK OCTET_SELFTEST_ONLY=mixed timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=BULK rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2 3; do
  for v in base bulk; do
    case $v in
      base) e="X=1";;
      bulk) e="OCTET_MIXED_EXP=BULK";;
    esac
    env $e timeout 120 dev-bin/octet bench mixed --device cuda --m 9,12,16,32,64 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
