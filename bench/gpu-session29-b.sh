#!/usr/bin/env bash
# Twenty-ninth session, call b ($OUT set; carry dev-bin: octet = the small-M
# kernel with a row-tile parameter (16, 32 or 64 weight rows a block, each x
# fragment feeding one to four mma row tiles) and OCTET_MIXED_TUNE to try a
# shape in place of the table's). At 16 tokens each block of 16 rows reads all
# of x from L2: twice the weight's bytes; 32 rows halve that.
# The weight-only selftest under each tried shape, then bench mixed
# M = 1,4,8,12,16 on the three weights, two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
mixed_configs OCTET_MIXED_TUNE "table 1:2:8:3 1:2:8:2 1:2:4:3 1:4:4:2 2:2:4:2 2:2:8:2 2:2:4:3 2:4:4:2" 2 copy \
  --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
