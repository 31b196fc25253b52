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
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
cfgs="0 8x3,4x3 8x2,4x2 16x2,8x2 8x4,16x2"
mixed_configs OCTET_MIXED_ASYNC "$cfgs" 2 same --m 1,4,8,16 --kn 4096x4096,4096x14336,8192x28672,2048x2048,2048x5632,5632x2048
for c in 0 8x3,4x3 16x2,8x2; do
  OCTET_MIXED_ASYNC=$c dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$c.txt 2>&1
  echo "generate $c rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$c.txt)"
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
