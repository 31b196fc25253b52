#!/usr/bin/env bash
# Seventh session (H100, $OUT set): conformance, the weight-only products with
# slabs of several sizes (large M), and the GPU suite (copy floor, quantize,
# GEMMs, Linear forward + backward incl. amaxes from the producers).
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160 | head -40
OCTET_BENCH_SLABS_MB=8,16,32,48 $bin bench mixed --device cuda --m ${MIXED_M:-1,4,16,64,256,2048} --json $OUT/mixed.json > $OUT/mixed.txt 2>&1
echo "mixed rc=$?"; cut -c1-200 $OUT/mixed.txt
if [ -z "${SKIP_GEMM:-}" ]; then
  $bin bench gemm --device cuda --json $OUT/gemm.json > $OUT/gemm.txt 2>&1
  echo "gemm rc=$?"; grep -E "copy|linear" $OUT/gemm.txt | cut -c1-200
fi
