#!/usr/bin/env bash
# Twenty-ninth session, call e ($OUT set; carry dev-bin: octet-old = 42f8c88;
# octet = the small-M kernel with the committed lane mapping (warp
# instructions over whole 128-byte rows; call d's two-lanes-a-row mapping read
# 0.32 of copy at 16 tokens), a source pointer a chunk stepped a block at a
# time, shared addresses stepped slot to slot (n16 loop ~300 instructions a
# block against ~427)).
# 1. weight-only selftest; 2. bench mixed M = 1,4,8,12,16 on the three
# weights, old / new, two rounds; 3. decode old / new, twice; 4. tune shapes.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
old_vs_new octet --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672
mixed_sets OCTET_MIXED_TUNE "w8s2=2:8:2 w4s3=2:4:3 w8s3=2:8:3" 1 copy --m 12,16 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
