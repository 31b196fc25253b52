#!/usr/bin/env bash
# (The OCTET_MIXED_ASYNC switch existed only for this session's comparisons; the
# configuration kept became the only small-M kernel in 8f72275.)
# Twenty-fourth session, third call ($OUT set; carry dev-bin): the cp.async
# small-M kernel with slots sized to the launch's tokens (M = 1 takes 256
# bytes of x a slot). Decode on the ~1B model, register kernel against
# cp.async (`8x3,4x2`), each with and without the dependent launch; then the
# mixed selftest cases and `octet bench mixed` at M = 1, 4, 8, 16 for the
# candidate configurations, in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
for pdl in 1 0; do
  for c in 0 8x3,4x2; do
    OCTET_MIXED_PDL=$pdl OCTET_MIXED_ASYNC=$c dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$c-pdl$pdl.txt 2>&1
    echo "generate $c pdl $pdl rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$c-pdl$pdl.txt)"
  done
done
cfgs="0 8x3,4x2 8x2,4x3 8x3,6x2"
mixed_configs OCTET_MIXED_ASYNC "$cfgs" 2 same --m 1,4,8,16 --kn 4096x4096,4096x14336,8192x28672,2048x2048,2048x5632,5632x2048
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
