#!/usr/bin/env bash
# Thirty-first session, call b ($OUT set; carry dev-bin: octet.gz = the
# working tree with tiled codes (`upload_fp8_weight_tiled`, used by the
# decoder and by `bench mixed`; the LoRA base stays row-major); octet-old.gz
# = HEAD a83c70c, row-major codes everywhere).
# 1. the full selftest (every weight-only case on both layouts, the two
#    bit-identical);
# 2. bench mixed at M = 1..16, 64, 256, 2048 on the three weights,
#    twice (tiled and row-major rows in the same round);
# 3. decode of the ~1B model, 256 tokens, greedy, FP8 beside bf16: old, new,
#    two rounds in turn; then 1800 tokens FP8 old, new.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
for rep in 1 2; do
  dev-bin/octet bench mixed --device cuda --m 1,2,4,8,12,16,64,256,2048 \
    --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$rep.txt 2>&1
  echo "== bench mixed rep $rep rc=$? ($((SECONDS-t0)) s)"
  tiled_vs_row $R/mixed-$rep.txt
  grep -E "^(mixed|gemm).*M=(256|2048)" $R/mixed-$rep.txt | sed 's/   */ /g' | cut -c1-150
done
G="generate --random-model 1b --device cuda"
for rep in 1 2; do
  for v in old new; do
    bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
    $bin $G --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g-$v-$rep.txt 2>&1
    echo "$v rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g-$v-$rep.txt) text $(text_md5 $R/g-$v-$rep.txt)"
  done
done
for v in old new; do
  bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
  $bin $G --weights fp8 --max-tokens 1800 --temperature 0 > $R/long-$v.txt 2>&1
  echo "1800 $v rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/long-$v.txt | tail -1)"
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
