#!/usr/bin/env bash
# Thirty-sixth session, call f ($OUT set; carry dev-bin: octet.gz = HEAD f290281).
# A reviewer's host-side checks in the CUDA backend (NVFP4 dequantize/GEMM block
# height and global scale, quantize_given_scale_into's output sizes,
# gemm_fp8_outer's scale lengths, grid-row limits of the row-wise, 128x128 and
# MXFP8 quantizers, dequantize element counts), with nine new bad-input cases
# written on a machine without a GPU: the full selftest runs them.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r36f; mkdir -p $R
{
timeout 400 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -E "block_rows=1|global scale of 2|row-wise-only|gemm_fp8_outer|grid limit" $R/selftest.txt | tr -s ' ' | cut -c1-250
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
