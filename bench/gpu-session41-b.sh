#!/usr/bin/env bash
# Forty-first session, call b, one H200 (carry dev-bin: octet.gz, call a's binary).
# Call a: 8 or 12 warps x 2 stages x 32 rows read 0.66-0.68 of copy on 4096x4096 at
# 12-16 tokens (table 0.58-0.59) and lost on 4096x14336. Which shape for launches
# whose 32-row blocks do not fill the SMs: more candidates, at 16 and 32 tokens, on
# weights of 64 to 448 blocks of 32 rows. One archive of raw files comes back.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
{
CFGS="table 2:8:2:2 2:12:2:2 2:10:2:2 2:13:2:2 2:8:2:1 2:6:2:1 2:4:2:1"
for rep in 1 2; do
  for c in $CFGS; do
    OCTET_MIXED_TUNE=$c timeout 60 dev-bin/octet bench mixed --device cuda --m 16,32 --kn 2048x2048,4096x4096,4096x8192,4096x14336 > "$R/mixed-${c//:/-}-$rep.txt" 2>&1
    echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s)"
    tiled_vs_row "$R/mixed-${c//:/-}-$rep.txt"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
