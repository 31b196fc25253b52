#!/usr/bin/env bash
# Thirtieth session, call g ($OUT set; carry dev-bin: octet.gz = the review
# commit: one run_step for both graph captures, sample_shares shared by the
# host sampler and the selftest). The full selftest; decode once (FP8 beside
# bf16, greedy); T 0.8, top-k 40 with and without --host-sampling.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
text_md5() { awk '/^weights  matrix bytes/{exit} {print}' "$1" | tr -cd '\11\12\15\40-\176' | md5sum | cut -c1-12; }
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
G="generate --random-model 1b --device cuda"
dev-bin/octet $G --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g.txt 2>&1
echo "greedy rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g.txt) text $(text_md5 $R/g.txt)"
for v in host device; do
  extra=""; [ $v = host ] && extra=--host-sampling
  dev-bin/octet $G $extra --weights fp8 --max-tokens 256 --temperature 0.8 --top-k 40 > $R/t-$v.txt 2>&1
  echo "T 0.8 $v rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/t-$v.txt | tail -1) text $(text_md5 $R/t-$v.txt)"
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
