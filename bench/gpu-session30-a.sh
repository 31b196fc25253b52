#!/usr/bin/env bash
# Thirtieth session, call a ($OUT set; carry dev-bin: octet = HEAD b66d250).
# The up-to-8-token shapes were last swept in the twenty-fourth session, before
# the spread rule (`small_smem`, twenty-seventh) changed how 4096x4096's few
# blocks land. Sweep warps x stages for that group again through
# OCTET_MIXED_TUNE (no rebuild): the weight-only selftest under each, then
# bench mixed M = 1,4,8 on the three weights, two rounds, share of the
# same-size copy.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
mixed_configs OCTET_MIXED_TUNE "table 1:16:2 1:16:3 1:12:2 1:4:3 1:4:4 1:8:4 1:6:3" 2 copy \
  --m 1,4,8 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
