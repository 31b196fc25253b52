#!/usr/bin/env bash
# Fortieth session, call b, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD
# plus the small-M kernel's row tiles, a template parameter RT that only
# OCTET_MIXED_TUNE's fourth field selects; the table is unchanged).
# Call a found 9-16 tokens at 0.56-0.82 of copy on this GPU (4223 GB/s), far
# below 1-8 tokens: each 16-row block reads all of x through L2, 2 bytes of x
# per code byte at 16 tokens. Two row tiles a block halve that. Each shape:
# the weight-only selftest under it, then the bench, all shapes in turn, twice.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=$OUT; KN=4096x4096,4096x14336,8192x28672
{
echo "## 9-16 tokens"
mixed_configs OCTET_MIXED_TUNE "table 2:4:3:2 2:8:3:2 2:4:2:2" 2 copy --m 12,16 --kn $KN
echo "## 1-8 tokens"
mixed_configs OCTET_MIXED_TUNE "1:8:2:2 1:8:3:2 1:4:3:2 table" 2 copy --m 1,4,8 --kn $KN
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
