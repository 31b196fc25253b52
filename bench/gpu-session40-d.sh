#!/usr/bin/env bash
# Fortieth session, call d, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD
# (SMALL_WIDE) with row tiles up to 4 for OCTET_MIXED_TUNE). Four tiles (64 weight
# rows a block) quarter x's L2 traffic per code byte at 16 tokens; fewer warps or
# slots keep their shared memory in bounds. Each shape replaces every 9-64-token
# launch; its weight-only selftest first, then the bench, all shapes in turn, twice.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=$OUT; KN=4096x4096,4096x14336,8192x28672
{
mixed_configs OCTET_MIXED_TUNE "table 2:4:2:4 2:2:3:4 2:2:4:4 2:4:3:4 2:8:3:2" 2 copy --m 12,16,32 --kn $KN
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
