#!/usr/bin/env bash
# Twenty-fifth session, sixth call ($OUT set; carry dev-bin: octet = the
# small-M kernel whose code copies carry the .L2::256B prefetch hint
# octet-old = 4a6fdd4, without it): the weight-only selftest cases of the new one, then `octet bench
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
# Result: level within 0.02 at every M; decode 744-795 against 722-745 tok/s (one pair each, noisy). Not kept.
