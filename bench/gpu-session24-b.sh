#!/usr/bin/env bash
# (The OCTET_MIXED_ASYNC switch existed only for this session's comparisons; the
# configuration kept became the only small-M kernel in 8f72275.)
# Twenty-fourth session, second call ($OUT set; carry dev-bin): configurations
# of the cp.async small-M kernel per token count (`OCTET_MIXED_ASYNC=W8xS8,W16xS16`,
# warps a block x stages for 8 and for 16 tokens) against the
# register-pipelined kernel (`0`): mixed selftest cases under each, `octet
# bench mixed` at M = 1, 4, 8, 16 on the issue's three weights and the ~1B
# model's three shapes, every configuration in turn, twice; decode on the ~1B model.
set -uo pipefail
t0=$SECONDS
R=$OUT/r
mkdir -p $R
cfgs="0 8x3,4x3 8x2,4x2 16x2,8x2 8x4,16x2"
for c in $cfgs; do
  OCTET_MIXED_ASYNC=$c OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-$c.txt 2>&1
  echo "selftest $c rc=$? ($((SECONDS-t0)) s): $(grep -cE '\bpass\b' $R/selftest-$c.txt) pass, $(grep -c FAIL $R/selftest-$c.txt) FAIL"
done
for rep in 1 2; do
  for c in $cfgs; do
    OCTET_MIXED_ASYNC=$c dev-bin/octet bench mixed --device cuda --m 1,4,8,16 \
      --kn 4096x4096,4096x14336,8192x28672,2048x2048,2048x5632,5632x2048 > $R/mixed-$c-$rep.txt 2>&1
    echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "graph, vs the same-size copy" $R/mixed-$c-$rep.txt | sed 's/   */ /g' | awk '{print $5 $6, $7, $(NF-2)}' | sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
  done
done
for c in 0 8x3,4x3 16x2,8x2; do
  OCTET_MIXED_ASYNC=$c dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$c.txt 2>&1
  echo "generate $c rc=$? ($((SECONDS-t0)) s)"; grep -a -A3 "matrix bytes" $R/generate-$c.txt | tail -2
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
