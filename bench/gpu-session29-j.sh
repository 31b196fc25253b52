#!/usr/bin/env bash
# Twenty-ninth session, call j ($OUT set; carry dev-bin: octet = the n16 row at 3 stages; as call h:
# committed kernel (calls d-g's rewrites reverted) with OCTET_MIXED_TUNE).
# 1. the full selftest; 2. the table, bench mixed M = 1..2048;
# 3. decode once.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
dev-bin/octet bench mixed --device cuda --m 1,4,16,64,256,2048 --kn 4096x4096,4096x14336,8192x28672 \
  --json $R/mixed-table.json > $R/mixed-table.txt 2>&1
echo "table rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $R/mixed-table.txt copy)"
grep -E "^mixed.*M=2048" $R/mixed-table.txt | sed 's/   */ /g' | awk '{print $3, $4, $5, $6, $(NF-2)}' | paste -sd' '
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
  --temperature 0 > $R/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
