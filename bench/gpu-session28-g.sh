#!/usr/bin/env bash
# Twenty-eighth session, call g ($OUT set; carry dev-bin: octet-old = 28c5b19,
# octet = batched prefill: the prompt's rows go through each product at once
# (up to 256 rows a launch; attention of each row over the positions up to
# its own), where the old build stepped through the prompt token by token).
# 1. the full selftest (new prefill cases against the CPU decoder);
# 2. decode old / new, the default 6-token prompt, 256 tokens, once each;
# 3. old / new with a 1050-token prompt: prefill and decode tok/s, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
grep -a "decode .* model\|FAIL" $R/selftest.txt | sed 's/   */ /g' | tee -a $R/summary.txt
for bin in octet-old octet; do
  dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
    --temperature 0 > $T/generate.txt 2>&1
  echo "generate 6+256 $bin rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
done | tee -a $R/summary.txt
P=$(python3 -c 'print("ROMEO: " * 150)')
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 --prompt "$P" > $T/generate.txt 2>&1
    echo "generate 1050+256 $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee -a $R/summary.txt
cp $T/generate.txt $R/generate-long-prompt.txt
echo "done ($((SECONDS-t0)) s)"
