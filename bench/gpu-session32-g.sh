#!/usr/bin/env bash
# Thirty-second session, call g ($OUT set; carry dev-bin: octet.gz = cf14814
# plus the few-block 16-token shape for f16 x, committed right after). The
# full selftest, bench mixed at the M (1, 4, 16, 64, 256, 2048, with
# 2, 8 and 12) on its three weights, one round, and decode against bf16.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
dev-bin/octet bench mixed --device cuda --m 1,2,4,8,12,16,64,256,2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed.txt 2>&1
echo "bench mixed rc=$? ($((SECONDS-t0)) s)"
echo "bf16 x: $(tiled_ratios $R/mixed.txt)"
echo "f16 x:  $(f16_ratios $R/mixed.txt)"
echo "row-major and all: $(tiled_vs_row $R/mixed.txt)"
echo "large: $(large_m_rows $R/mixed.txt)"
grep -E "^mixed.*M=(1|16|64), [0-9]+ weights back to back" $R/mixed.txt | sed 's/   */ /g' | cut -c1-150
grep -E "^gemm.*M=(1|16|64), [0-9]+ weights back to back" $R/mixed.txt | sed 's/   */ /g' | cut -c1-150
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g.txt 2>&1
echo "greedy rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g.txt) text $(text_md5 $R/g.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
