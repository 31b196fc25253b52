#!/usr/bin/env bash
# Twenty-eighth session, call f ($OUT set; carry dev-bin: octet-old = 3a21934
# (the last run combines in parallel), octet = the glue kernels launched as
# programmatic dependents of the kernel before them (each starts with
# griddepcontrol.wait), hiding their launch latency behind the products).
# 1. the full selftest;
# 2. decode old / new, 256 tokens, FP8 and bf16 weights, two rounds;
# 3. decode old / new, 1800 tokens, once;
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
echo "done ($((SECONDS-t0)) s)"
