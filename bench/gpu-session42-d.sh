#!/usr/bin/env bash
# Forty-second session, call d, one H200 (carry dev-bin: octet.gz = HEAD with
# paired warps, `OCTET_MIXED_TUNE=...:stepped:paired`). Call c: at 12 tokens the
# few-block shape read 0.93-0.94 of copy on 8192x28672 where two of its blocks
# fit an SM (16 warps) and 0.84 at 16 tokens where one does (8). Paired warps
# give 16 warps the shared memory of 8, x still read once for 32 rows. The
# weight-only selftest under two paired shapes, then the table against them at
# 12-16 tokens, two rounds in opposite orders.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r42d; mkdir -p $R
{
for t in 2:16:2:2:1:1 2:8:2:2:1:1; do
  OCTET_MIXED_TUNE=$t OCTET_SELFTEST_ONLY=mixed timeout 150 dev-bin/octet selftest --device cuda > $R/selftest-$t.txt 2>&1
  echo "mixed selftest tune $t rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-$t.txt | head -3 | cut -c1-300)"
done
run() {  # ROUND TUNE
  OCTET_MIXED_TUNE=$2 timeout 100 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$1-$2.txt 2>&1
  echo "== round $1 tune $2 rc=$? ($((SECONDS-t0)) s)"; tiled_vs_row $R/mixed-$1-$2.txt
}
for t in table 2:16:2:2:1:1 2:16:3:2:1:1 2:8:2:2:1:1 2:8:3:2:1:1; do run 1 $t; done
for t in 2:8:3:2:1:1 2:8:2:2:1:1 2:16:3:2:1:1 2:16:2:2:1:1 table; do run 2 $t; done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
