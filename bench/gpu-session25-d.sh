#!/usr/bin/env bash
# Twenty-fifth session, fourth call ($OUT set; carry dev-bin: octet = the
# small-M kernel with lean copies (per-lane cursors kept in registers,
# coalesced rows, guards only in a partial last block or row tile); octet-old =
# 9fc6b5c's kernel): the weight-only selftest cases of the new one, then `octet bench
# mixed` at M = 1, 4, 8, 12, 16 on the issue's three weights, old and new in
# turn, twice; then decode on the ~1B model, in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
for bin in octet; do
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
# Result: mixed (4096x4096 M = 4-8 +0.02-0.05, 4096x14336 M = 1 +0.03; 4096x14336 M = 8 -0.03, M = 12 -0.08; M = 16 level; decode level): fewer instructions did not move M = 16. Reverted.
