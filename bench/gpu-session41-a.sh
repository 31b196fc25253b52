#!/usr/bin/env bash
# Forty-first session, call a, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD,
# with this session's CPU numerics fixes). The full selftest; then, for the one
# weak cell on this GPU (4096x4096 at 9-16 tokens, bf16 x: 0.58 of copy; the
# fortieth session's call b read 0.63 with 8 warps x 3 stages x 32 rows), more
# warps and stages at 32 rows a block on the two weights of few blocks, in turn,
# twice, without a selftest each (the winner's comes in a later call).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=$OUT
{
timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3 | cut -c1-300)"
CFGS="table 2:8:3:2 2:6:3:2 2:8:2:2 2:6:4:2 2:12:2:2 2:5:4:2"
for rep in 1 2; do
  for c in $CFGS; do
    OCTET_MIXED_TUNE=$c timeout 60 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336 > "$R/mixed-${c//:/-}-$rep.txt" 2>&1
    echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s)"
    tiled_vs_row "$R/mixed-${c//:/-}-$rep.txt"
  done
done
gzip -9 $R/selftest*.txt
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
