#!/usr/bin/env bash
# Thirty-first session, call i ($OUT set; carry dev-bin: octet.gz = the
# working tree: the small-M kernel loads its two post factors (rows g and
# g + 8 of its lane) before `grid_wait` instead of after the loop;
# octet-old.gz = dfc1423).
# 1. the full selftest; 2. bench mixed M = 1, 4, 8, 16, old and new in turn,
# two rounds (tiled and row-major rows); 3. decode of the ~1B model, 256
# tokens, greedy, FP8 beside bf16: old, new, two rounds (the same text).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
for rep in 1 2; do
  for v in old new; do
    bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
    $bin bench mixed --device cuda --m 1,4,8,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s): $(tiled_vs_row $R/mixed-$v-$rep.txt)"
  done
done
G="generate --random-model 1b --device cuda"
for rep in 1 2; do
  for v in old new; do
    bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
    $bin $G --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g-$v-$rep.txt 2>&1
    echo "$v rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g-$v-$rep.txt) text $(text_md5 $R/g-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
