#!/usr/bin/env bash
# (The OCTET_MIXED_ASYNC switch existed only for this session's comparisons; the
# configuration kept became the only small-M kernel in 8f72275.)
# Twenty-fourth session, first call ($OUT set; carry dev-bin): the small-M
# weight-only kernel copying its codes and x tiles ahead into shared memory by
# cp.async (`OCTET_MIXED_ASYNC=WxS`: warps a block x stages) against the
# register-pipelined kernel (`0`). The mixed selftest cases under each
# configuration, then `octet bench mixed` at M = 1, 8, 16 on the three
# weights, every configuration in turn, twice; then decode on the ~1B model.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
cfgs="0 4x4 4x3 8x3 2x4"
mixed_configs OCTET_MIXED_ASYNC "$cfgs" 2 same --m 1,8,16 --kn 4096x4096,4096x14336,8192x28672
for c in 0 4x4; do
  OCTET_MIXED_ASYNC=$c dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$c.txt 2>&1
  echo "generate $c rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$c.txt)"
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
