#!/usr/bin/env bash
# Forty-second session, call c, one H200 (carry dev-bin: octet.gz = HEAD, the
# few-block 16-token shape with stepped copies; K split reverted). Call b's ncu
# counted 201 instructions a stage for the copies' 16 cp.async (a quarter of the
# warp's), against 333 for the multiply. The selftest (table; 64-row blocks
# stepped), then the table against the few shape's per-piece copies
# (2:8:2:2:0, compared on 4096x4096) and 64-row blocks stepped (2:4:2:4:1,
# compared on the larger weights), two rounds in opposite orders.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r42c; mkdir -p $R
{
for t in table 2:4:2:4:1; do
  OCTET_MIXED_TUNE=$t OCTET_SELFTEST_ONLY=mixed timeout 150 dev-bin/octet selftest --device cuda > $R/selftest-$t.txt 2>&1
  echo "mixed selftest tune $t rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-$t.txt | head -3 | cut -c1-300)"
done
run() {  # ROUND TUNE
  OCTET_MIXED_TUNE=$2 timeout 100 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$1-$2.txt 2>&1
  echo "== round $1 tune $2 rc=$? ($((SECONDS-t0)) s)"; tiled_vs_row $R/mixed-$1-$2.txt
}
for t in table 2:8:2:2:0 2:4:2:4:1; do run 1 $t; done
for t in 2:4:2:4:1 2:8:2:2:0 table; do run 2 $t; done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
