#!/usr/bin/env bash
# Forty-second session, call a, one H200 (carry dev-bin: octet.gz = HEAD with
# the K split over clusters of two blocks, `OCTET_MIXED_TUNE=...:ksplit`).
# Part 1: the GPU trainer through the forty-first session's CLI review paths
# (call d of that session, which never ran). Part 2: the weight-only selftest
# with 16-token launches on 64-row blocks whose clusters of two split K; then
# the table against cluster shapes at 12-16 tokens, two rounds in opposite orders.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
bash bench/gpu-session41-d.sh
mv $OUT/summary.txt $OUT/cli-summary.txt
R=/tmp/r42; mkdir -p $R
{
for t in 2:8:2:4:2 2:4:3:4:2; do
  OCTET_MIXED_TUNE=$t OCTET_SELFTEST_ONLY=mixed timeout 150 dev-bin/octet selftest --device cuda > $R/selftest-$t.txt 2>&1
  echo "mixed selftest tune $t rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-$t.txt | head -3 | cut -c1-300)"
done
run() {  # ROUND TUNE
  OCTET_MIXED_TUNE=$2 timeout 100 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$1-$2.txt 2>&1
  echo "== round $1 tune ${2:-table} rc=$? ($((SECONDS-t0)) s)"; tiled_vs_row $R/mixed-$1-$2.txt
}
for t in table 2:8:2:4:2 2:4:3:4:2 2:4:4:4:2 2:8:2:2:2; do run 1 $t; done
for t in 2:8:2:2:2 2:4:4:4:2 2:4:3:4:2 2:8:2:4:2 table; do run 2 $t; done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R . -C /tmp g1.txt g2.txt g3.txt g4.txt g5.txt g6.txt
