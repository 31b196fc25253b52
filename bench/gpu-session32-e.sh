#!/usr/bin/env bash
# Thirty-second session, call e ($OUT set; carry dev-bin: octet.gz = 26cef7a
# plus an uncommitted kernel for 17 to 64 tokens, `mixed_mid_m`: a block of
# two row tiles x two halves of K sharing one x tile per half, every token
# in one block). The weight-only selftest (hardware and integer
# conversions), then bench mixed at M = 16-64 with it and with
# OCTET_MIXED_MID=0 (groups of 16 on the small-M kernel), two rounds.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest mixed rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10
grep -a "m=\(17\|40\|64\) " $R/selftest.txt | grep -o "worst error / bound [0-9.]*" | sort -k5 -g | tail -1
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-soft.txt 2>&1
echo "selftest soft rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-soft.txt)"
grep -a FAIL $R/selftest-soft.txt | head -5
for rep in 1 2; do
  for v in 1 0; do
    OCTET_MIXED_MID=$v dev-bin/octet bench mixed --device cuda --m 16,17,24,32,48,64 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-mid$v-$rep.txt 2>&1
    echo "== mid=$v rep $rep rc=$? ($((SECONDS-t0)) s)"
    echo "   bf16 x: $(tiled_ratios $R/mixed-mid$v-$rep.txt)"
    echo "   f16 x:  $(f16_ratios $R/mixed-mid$v-$rep.txt)"
    echo "   row:    $(tiled_vs_row $R/mixed-mid$v-$rep.txt | tr ' ' '\n' | paste - - - - | grep row | paste -sd' ')"
    grep -E "^gemm.*M=(32|64), [0-9]+ weights back to back" $R/mixed-mid$v-$rep.txt | sed 's/   */ /g' | awk '{print $4 $5, $6, $(NF-2)}' | paste -sd' '
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
