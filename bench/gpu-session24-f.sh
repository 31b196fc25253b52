#!/usr/bin/env bash
# Twenty-fourth session, sixth call ($OUT set; carry dev-bin: octet-old = the
# committed cp.async kernel, a9d2e4b; octet = the same with a loop over row
# tiles, its ring running on across tiles, launched one block a tile as
# before or, with OCTET_MIXED_PERSIST=1 (a switch of this call only), with the
# blocks that fit at once). Mixed selftest cases, `octet bench mixed` at M =
# 1, 4, 8, 12, 16 on the three weights and the ~1B shapes, the three
# in turn, twice; decode on the ~1B model.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
for p in 0 1; do
  OCTET_MIXED_PERSIST=$p OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-p$p.txt 2>&1
  echo "selftest persist $p rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-p$p.txt)"
done
for rep in 1 2; do
  for v in old p0 p1; do
    bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
    OCTET_MIXED_PERSIST=${v#p} $bin bench mixed --device cuda --m 1,4,8,12,16 \
      --kn 4096x4096,4096x14336,8192x28672,2048x2048,2048x5632,5632x2048 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s)"
    mixed_ratios $R/mixed-$v-$rep.txt copy
  done
done
for v in old p1 p0; do
  bin=dev-bin/octet; [ $v = old ] && bin=dev-bin/octet-old
  OCTET_MIXED_PERSIST=${v#p} $bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$v.txt 2>&1
  echo "generate $v rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$v.txt)"
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
# Not kept (BENCHMARKS.md): the tile loop was reverted after this call.
