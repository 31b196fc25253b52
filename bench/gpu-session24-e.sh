#!/usr/bin/env bash
# Twenty-fourth session, fifth call ($OUT set; carry dev-bin): blocks of two
# 16-row tiles sharing each x tile (half the x bytes per weight byte through
# L2 and shared memory) for 9-16 tokens (and 5-8), against the committed
# shapes. `OCTET_MIXED_SMALL=TAG8,TAG16` swapped the kernels for this call
# only. Mixed selftest cases under each, then `octet bench mixed` at M = 8,
# 12, 16 on the three weights, in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
cfgs="n8,n16 n8,n16w4s2r2 n8,n16w2s3r2 n8,n16w2s2r2 n8,n16w4s3r2 n8w8s2r2,n16"
mixed_configs OCTET_MIXED_SMALL "$cfgs" 2 copy --m 8,12,16 --kn 4096x4096,4096x14336,8192x28672
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
# Slower everywhere (BENCHMARKS.md); the two-row-tile kernels were removed after this call.
