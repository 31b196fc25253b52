#!/usr/bin/env bash
# Thirty-first session, call j ($OUT set; carry dev-bin: octet.gz = the
# working tree: over row-major codes the post factors load after the loop
# again (held through the loop they took the 4-token kernel to 83 registers,
# two blocks an SM); tiled kernels unchanged; octet-old.gz = HEAD b85902d
# (call i's build). The weight-only selftest; bench mixed M = 1,
# 4, 8, 16, old and new in turn, two rounds; one decode.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest (weight-only) rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
for rep in 1 2; do
  for v in old new; do
    bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
    $bin bench mixed --device cuda --m 1,4,8,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s): $(tiled_vs_row $R/mixed-$v-$rep.txt)"
  done
done
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g.txt 2>&1
echo "greedy rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g.txt) text $(text_md5 $R/g.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
