#!/usr/bin/env bash
# Twenty-fifth session, first call ($OUT set; carry dev-bin): the small-M
# kernel generalized to RW row tiles a block (a warp each, sharing each x tile
# through one ring per K split) and KS warps splitting K. `OCTET_MIXED_SMALL`
# (a switch of this experiment) picks candidate shapes per token class. For
# each set: the weight-only selftest cases, then `octet bench mixed` at
# M = 1, 4, 8, 12, 16 on the three weights, sets in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
mixed_sets OCTET_MIXED_SMALL "base= b=16:r2k2s3,8:r2k4s3,4:r2k4s4 c=16:r2k2s4,8:r2k2s4 d=16:r2k4s2,8:r4k2s4" 2 copy \
  --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
# Result: no set beat the committed shapes at M = 12-16 (bench-results/h100-session25-a-mixed-row-tiles.txt); the row-tile variant was not kept.
