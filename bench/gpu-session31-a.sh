#!/usr/bin/env bash
# Thirty-first session, call a ($OUT set; carry dev-bin: octet = HEAD a83c70c
# + the tiled-codes experiment, an uncommitted build: OCTET_MIXED_TILED=1
# uploaded a second, tiled copy of each weight and compiled the tiled small-M
# kernels, the same kernel code as the committed `...t` kernels; the next
# commit made the layout a property of the upload instead). The small-M kernel reads each warp's 16 x 128 block
# of codes from 16 rows K bytes apart. OCTET_MIXED_TILED=1 packs a second copy
# of the codes as (N/16, K/128, 16, 128), each warp's block one contiguous
# 2 KiB run and a block's whole tile one 16K-byte run, and runs the same
# kernels over it (same shapes, same shared-memory layout). Weight-only
# selftest under each, then bench mixed M = 1..16 on the three
# weights, three rounds, share of the 1 GiB copy.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
R=$OUT/r; mkdir -p $R
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv
mixed_configs OCTET_MIXED_TILED "0 1" 3 copy \
  --m 1,2,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
