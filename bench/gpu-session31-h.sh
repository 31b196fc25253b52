#!/usr/bin/env bash
# Thirty-first session, call h ($OUT set; carry dev-bin: octet.gz = the
# working tree: the decode norms load their weight g before `grid_wait` (it
# is constant) and keep up to four elements a thread in registers between
# their two passes; octet-old.gz = HEAD fc31377 (an experiment build whose
# only change, OCTET_MIXED_L2HINT, is off when unset).
# 1. the full selftest; 2. decode of the ~1B model, 256 tokens, greedy, FP8
# beside bf16: old, new, three rounds in turn (the same text: the same sums
# in the same order); 3. 1800 tokens FP8 old, new.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
G="generate --random-model 1b --device cuda"
for rep in 1 2 3; do
  for v in old new; do
    bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
    $bin $G --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g-$v-$rep.txt 2>&1
    echo "$v rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g-$v-$rep.txt) text $(text_md5 $R/g-$v-$rep.txt)"
  done
done
for v in old new; do
  bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
  $bin $G --weights fp8 --max-tokens 1800 --temperature 0 > $R/long-$v.txt 2>&1
  echo "1800 $v rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/long-$v.txt | tail -1) text $(text_md5 $R/long-$v.txt)"
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
