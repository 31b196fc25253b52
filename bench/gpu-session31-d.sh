#!/usr/bin/env bash
# Thirty-first session, call d ($OUT set; carry dev-bin: octet.gz = the
# working tree: SwiGLU in the gate/up product's epilogue (gate and up rows
# interleaved by 8 features, `mixed_matmul_swiglu`) for up to 64 rows;
# octet-old.gz = e30c96a, tiled codes, SwiGLU a kernel of its own).
# 1. the full selftest (the fused product against host SwiGLU of the
#    kernel's own f32 product, both layouts; decoding against the CPU);
# 2. bench mixed M = 1, 4, 16 (the unfused product is unchanged but for the
#    mode bits), one round;
# 3. decode of the ~1B model, 256 tokens, greedy, FP8 beside bf16: old, new,
#    two rounds in turn (the same text: the fused epilogue computes the same
#    f32 gate and up and the same formula); 1800 tokens FP8 old, new.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
grep -a "mixed SwiGLU" $R/selftest.txt | sed 's/   */ /g' | awk '{print $NF}' | sort -n | tail -1 | sed 's/^/worst SwiGLU error \/ bound: /'
grep -a "decode small model, fp8.*SQNR" $R/selftest.txt | sed 's/   */ /g' | head -3
dev-bin/octet bench mixed --device cuda --m 1,4,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed.txt 2>&1
echo "bench mixed rc=$? ($((SECONDS-t0)) s): $(tiled_ratios $R/mixed.txt)"
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
  echo "1800 $v rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/long-$v.txt | tail -1) text $(text_md5 $R/long-$v.txt)"
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
