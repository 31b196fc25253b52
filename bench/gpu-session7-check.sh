#!/usr/bin/env bash
# Seventh session, last device call (H100, $OUT set): conformance of the final
# binary, and the Linear suite again (the bench's GEMM triple was refactored).
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160 | head -20
$bin bench linear --device cuda --shapes 8192x8192x8192 > $OUT/linear.txt 2>&1; echo "linear rc=$?"
grep -E "linear" $OUT/linear.txt | cut -c1-150
