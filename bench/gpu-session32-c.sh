#!/usr/bin/env bash
# Thirty-second session, call c ($OUT set; carry dev-bin: octet.gz =
# 0192b79 plus an uncommitted STEP variant of the small-M kernel's tiled
# copies). The f16 result of calls a-b says the 16-token loop is bound by
# its instructions on 4096x4096; STEP cuts the copies' address arithmetic
# (per-lane bases and fixed 512-byte offsets, only the block steps): the
# n16 loop 424 -> 333 SASS instructions, n4 304 -> 247. OCTET_MIXED_EXP=step
# compiles the OCTET_MIXED_TUNE shape with it; each table shape against its
# STEP twin, weight-only selftest under each, two rounds; decode.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for c in 2-4-3 1-8-3 1-8-2; do
  OCTET_MIXED_TUNE=${c//-/:} OCTET_MIXED_EXP=step OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-step-$c.txt 2>&1
  echo "selftest step $c rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-step-$c.txt)"
  grep -a FAIL $R/selftest-step-$c.txt | head -5
done
for rep in 1 2; do
  for c in 2-4-3 1-8-3 1-8-2; do
    ms=12,16; [ $c = 2-4-3 ] || ms=1,2,4,8
    [ $c = 1-8-2 ] && ms=8
    for v in table step; do
      env OCTET_MIXED_TUNE=${c//-/:} OCTET_MIXED_EXP=$v dev-bin/octet bench mixed --device cuda --m $ms --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$c-$v-$rep.txt 2>&1
      echo "== $c $v rep $rep rc=$? ($((SECONDS-t0)) s)"
      echo "   bf16 x: $(tiled_ratios $R/mixed-$c-$v-$rep.txt)"
      echo "   f16 x:  $(f16_ratios $R/mixed-$c-$v-$rep.txt)"
    done
  done
done
for rep in 1 2; do
  for v in table step; do
    env OCTET_MIXED_TUNE=1:8:3 OCTET_MIXED_EXP=$v dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --max-tokens 256 --temperature 0 > $R/g-$v-$rep.txt 2>&1
    echo "greedy $v rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g-$v-$rep.txt) text $(text_md5 $R/g-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
