#!/usr/bin/env bash
# Twenty-ninth session, call d ($OUT set; carry dev-bin: octet-old = 42f8c88;
# (octet-mid, not carried: the working tree limit) = the small-M kernel's copies with per-lane source pointers
# stepped a block at a time and constant offsets; octet = that plus
# shared-memory addresses stepped slot to slot (ptxas recomputed the
# lane-derived addresses in every block: ~1/3 of the loop's instructions; on
# sm_90a the n16 loop goes from ~427 to ~305 instructions a block).
# 1. weight-only selftest of mid and new; 2. bench mixed M = 1,4,8,12,16 on
# the three weights, old / mid / new, two rounds; 3. decode old / new, twice;
# 4. new binary with OCTET_MIXED_TUNE shapes for 16 tokens (8 warps, 3 stages).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
for bin in octet; do
  OCTET_SELFTEST_ONLY=mixed dev-bin/$bin selftest --device cuda > "$R/selftest-$bin.txt" 2>&1
  echo "selftest $bin rc=$? ($((SECONDS-t0)) s): $(selftest_counts "$R/selftest-$bin.txt")"
done
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin bench mixed --device cuda --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672 > "$R/mixed-$bin-$rep.txt" 2>&1
    echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
    mixed_ratios "$R/mixed-$bin-$rep.txt" copy
  done
done
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > "$R/generate-$bin-$rep.txt" 2>&1
    echo "generate $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows "$R/generate-$bin-$rep.txt")"
  done
done
mixed_configs OCTET_MIXED_TUNE "2:8:2 2:4:3 2:8:3 1:8:2 1:4:3" 1 copy --m 1,8,16 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
