#!/usr/bin/env bash
# Thirty-second session, call a ($OUT set; carry dev-bin: octet.gz = an
# uncommitted experiment build on 6ee7a1e). Does the code conversion bound
# the small-M kernel at 12-16 tokens? OCTET_MIXED_EXP=f16 compiles the
# OCTET_MIXED_TUNE shape with one conversion a pair of codes (FP8 -> f16x2)
# and f16 mma, reading the bf16 x bits as f16: the products are wrong, the
# timing is that of an f16-activation kernel. Against the table's bf16
# kernel (and the same shape in bf16) in the same call, two rounds.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
run() { # TAG ENV... 
  local tag=$1; shift
  env "$@" dev-bin/octet bench mixed --device cuda --m $MS --kn 4096x4096,4096x14336,8192x28672 > "$R/mixed-$tag-$rep.txt" 2>&1
  echo "== $tag rep $rep rc=$? ($((SECONDS-t0)) s): $(tiled_ratios "$R/mixed-$tag-$rep.txt")"
}
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
for rep in 1 2; do
  MS=12,16
  run table X=1
  run f16-2:4:3 OCTET_MIXED_TUNE=2:4:3 OCTET_MIXED_EXP=f16
  run f16-2:6:3 OCTET_MIXED_TUNE=2:6:3 OCTET_MIXED_EXP=f16
  run f16-2:8:2 OCTET_MIXED_TUNE=2:8:2 OCTET_MIXED_EXP=f16
  MS=1,4,8
  run table X=1
  run f16-1:8:3 OCTET_MIXED_TUNE=1:8:3 OCTET_MIXED_EXP=f16
  run f16-1:8:2 OCTET_MIXED_TUNE=1:8:2 OCTET_MIXED_EXP=f16
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
