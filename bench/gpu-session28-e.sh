#!/usr/bin/env bash
# Twenty-eighth session, call e ($OUT set; carry dev-bin: octet-old = 06ca756
# (attention split along the sequence), octet = the last run's combine
# parallel over runs (weights in shared memory) instead of each thread
# reading every run's max and sum in turn).
# 1. the full selftest;
# 2. decode old / new, 256 tokens, FP8 and bf16 weights, two rounds;
# 3. decode old / new, 1800 tokens, once;
# 4. the issue's table on the new binary: `bench mixed` M = 1,4,16,64,256,2048.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
grep -a "decode .* model" $R/selftest.txt | sed 's/   */ /g' | tee -a $R/summary.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > $T/generate.txt 2>&1
    echo "generate 256 $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee -a $R/summary.txt
for bin in octet-old octet; do
  dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 1800 \
    --temperature 0 > $T/generate.txt 2>&1
  echo "generate 1800 $bin rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
done | tee -a $R/summary.txt
cp $T/generate.txt $R/generate-1800.txt
dev-bin/octet bench mixed --device cuda --m 1,4,16,64,256,2048 --kn 4096x4096,4096x14336,8192x28672 \
  --json $R/mixed-table.json > $R/mixed-table.txt 2>&1
echo "table rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $R/mixed-table.txt copy)" | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
