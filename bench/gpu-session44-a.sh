#!/usr/bin/env bash
# Forty-fourth session, call a, one H200 (carry dev-bin: octet.gz = HEAD: the
# few-block 16-token shape on every device, the wide ones by DRAM bandwidth an SM;
# `bench mixed` times one weight over and over, L2-resident). Tests the reason for
# the new rule: with the table's shapes (OCTET_MIXED_WIDE=0) 4096x4096 at 16 tokens
# took 6.9 us on both the H100 and the H200, so DRAM should not be what holds it.
# If so, the same launch with its weight resident in L2 takes about as long, and
# the few-block shape's L2-resident time is what the H100 could reach. The full
# selftest first (the device line names the shapes), then `bench mixed` at 1-16
# tokens on two weights, default and OCTET_MIXED_WIDE=0, two rounds in opposite orders.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
dev_bin /tmp/r44a
{
gpu_line
timed_selftest selftest selftest.txt 300
timed_selftest "mixed selftest wide=0" selftest-0.txt 150 OCTET_MIXED_WIDE=0 OCTET_SELFTEST_ONLY=mixed
run() {  # ROUND WIDE
  if [ $2 = default ]; then unset OCTET_MIXED_WIDE; else export OCTET_MIXED_WIDE=$2; fi
  timeout 120 $B bench mixed --device cuda --m 1,8,12,16 --kn 4096x4096,4096x14336 > $R/mixed-$1-$2.txt 2>&1
  echo "== round $1 wide $2 rc=$? ($((SECONDS-t0)) s)"
  echo "back to back (DRAM): $(tiled_vs_row $R/mixed-$1-$2.txt)"
  l2_rows $R/mixed-$1-$2.txt | sed 's/^/L2-resident, /'
}
run 1 default; run 1 0; run 2 0; run 2 default
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
