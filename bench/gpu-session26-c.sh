#!/usr/bin/env bash
# Twenty-sixth session, call c ($OUT set; carry dev-bin: octet-old = the
# committed kernels, octet = 16-token E4M3 kernel converting half its code
# pairs by integer code): the weight-only selftest of both (and of the new one
# on the Ampere path for M > 64: integer upcast + cuBLASLt bf16), then
# `bench mixed` at M = 1, 8, 12, 16 on the issue's three weights, the binaries
# in turn, twice; decode, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R $OUT/r
OCTET_MIXED=upcast OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $OUT/r/selftest-ampere-upcast.txt 2>&1
echo "selftest ampere upcast rc=$? ($((SECONDS-t0)) s): $(selftest_counts $OUT/r/selftest-ampere-upcast.txt)"
old_vs_new "octet-old octet" --m 1,8,12,16 --kn 4096x4096,4096x14336,8192x28672 2>&1 | tee $OUT/r/old-vs-new.txt
echo "done ($((SECONDS-t0)) s)"
