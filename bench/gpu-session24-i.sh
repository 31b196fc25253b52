#!/usr/bin/env bash
# Twenty-fourth session, ninth call ($OUT set; carry dev-bin): after the
# review. Lanes of tokens past a slot's rows now read that row with its own
# swizzle (they read another row's chunk before; their outputs are not
# stored either way), one selftest shape now wraps the 8-warp ring. The
# weight-only selftest cases, then `octet bench mixed` at M = 1-16 on the
# issue's three weights, once.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
dev-bin/octet bench mixed --device cuda --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed.txt 2>&1
echo "bench rc=$? ($((SECONDS-t0)) s)"
mixed_ratios $R/mixed.txt copy
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
