#!/usr/bin/env bash
# Twenty-fifth session, third call ($OUT set; carry dev-bin: octet = the
# small-M kernel with lean copies (per-lane addresses fixed outside the loop,
# immediate offsets, K guards only in a partial last block); octet-old =
# 9fc6b5c's kernel): the weight-only selftest cases of both, then `octet bench
# mixed` at M = 1, 4, 8, 12, 16 on the issue's three weights, old and new in
# turn, twice; then decode on the ~1B model, in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
for bin in octet-old octet; do
  OCTET_SELFTEST_ONLY=mixed dev-bin/$bin selftest --device cuda > $R/selftest-$bin.txt 2>&1
  echo "selftest $bin rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-$bin.txt)"
done
grep -E "FAIL" $R/selftest-octet.txt | head -5
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin bench mixed --device cuda --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$bin-$rep.txt 2>&1
    echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
    mixed_ratios $R/mixed-$bin-$rep.txt copy
  done
done
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$bin-$rep.txt 2>&1
    echo "generate $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$bin-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
# Result: slower at every M (M = 16 0.28-0.38 of copy): each quarter-warp's 16-byte copies landed in one bank group (16 rows of 128 bytes at the same column). Not kept.
