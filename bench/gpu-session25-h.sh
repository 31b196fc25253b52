#!/usr/bin/env bash
# Twenty-fifth session, final call ($OUT set; carry dev-bin: HEAD's binary):
# the full selftest, `octet bench mixed` at M = 1-16 and 2048 on the issue's
# three weights, and decode on the ~1B model.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
dev-bin/octet bench mixed --device cuda --m 1,4,8,12,16,2048 --kn 4096x4096,4096x14336,8192x28672 \
  --json $R/mixed.json > $R/mixed.txt 2>&1
echo "== mixed rc=$? ($((SECONDS-t0)) s)"
mixed_ratios $R/mixed.txt copy
grep -E "^mixed.*M=2048" $R/mixed.txt | sed 's/   */ /g' | awk '{print $4, $5, $6, $(NF-2)}' | paste -sd' '
grep -E "mixed speedup" $R/mixed.txt | grep -E "back to back" | sed 's/   */ /g' | awk '{print $4, $5, $6, $(NF-2)}' | paste -sd' '
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)"
echo "done ($((SECONDS-t0)) s)"
# Result: 482 of 482; figures in BENCHMARKS.md (twenty-fifth session, final call).
