#!/usr/bin/env bash
# Thirty-second session, call i ($OUT set; carry dev-bin: octet.gz = 446abfc
# plus the review's fixes, committed right after: the few-block f16 shape is
# loaded only where two of its blocks fit an SM, `max_abs` propagates NaN,
# `gemm_f16` writes f32 only). On the H100 nothing should move: the
# weight-only selftest, and bench mixed at 12 and 16 tokens on two weights.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest mixed rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336 > $R/mixed.txt 2>&1
echo "bench rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed.txt) | f16 x: $(f16_ratios $R/mixed.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
