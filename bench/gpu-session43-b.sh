#!/usr/bin/env bash
# Forty-third session, call b, one H200 (carry dev-bin: octet.gz = HEAD with the
# wide and few-block 16-token shapes gated on peak DRAM bandwidth an SM,
# `OCTET_MIXED_WIDE`). Checks that the driver reports the memory clock and bus
# width (the device line), that the H200 still takes the wide shapes by default,
# and that OCTET_MIXED_WIDE=0 (the H100's path) gives the table's shapes back:
# the weight-only selftest under each, then 12-16 tokens on issue 6's weights,
# two rounds in opposite orders.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r43b; mkdir -p $R
B=$PWD/dev-bin/octet
{
for w in default 0; do
  if [ $w = default ]; then unset OCTET_MIXED_WIDE; else export OCTET_MIXED_WIDE=$w; fi
  OCTET_SELFTEST_ONLY=mixed timeout 150 $B selftest --device cuda > $R/selftest-$w.txt 2>&1
  echo "mixed selftest wide=$w rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-$w.txt | head -3 | cut -c1-300)"
  grep -a -m1 "DRAM peak" $R/selftest-$w.txt | cut -c1-300
done
run() {  # ROUND WIDE
  if [ $2 = default ]; then unset OCTET_MIXED_WIDE; else export OCTET_MIXED_WIDE=$2; fi
  timeout 100 $B bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$1-$2.txt 2>&1
  echo "== round $1 wide $2 rc=$? ($((SECONDS-t0)) s)"; tiled_vs_row $R/mixed-$1-$2.txt
}
run 1 default; run 1 0; run 2 0; run 2 default
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
