#!/usr/bin/env bash
# Forty-fifth session, call a, one H200 (carry dev-bin: octet.gz = the PRE
# experiment, 99b282b; reverted after this call, the patch is bench/session45-pre.patch). `PRE` in mixed.cu: the codes copied before griddepcontrol.wait
# form their own cp.async group, and the first block's codes are converted while
# its x tile (copied only after the wait) is on its way. Tried through
# OCTET_MIXED_TUNE's sixth field against the same shape without it:
# - full selftest (every shipped kernel was rebuilt around the new stage body);
# - weight-only selftest under the PRE tune shapes (16-token few-block, 8-token);
# - bench mixed on 4096x4096: the few-block shape (2:8:2:2:1) at 12-16 tokens,
#   the table's 16-token shape (2:4:3), the 8-token shape (1:8:2), each with and
#   without PRE, two rounds in opposite orders, DRAM and L2-resident rows.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
dev_bin /tmp/r45a
{
gpu_line
timed_selftest selftest selftest.txt 300
for tune in 2:8:2:2:1:1 1:8:2:1:0:1; do
  timed_selftest "mixed selftest tune $tune" selftest-$tune.txt 150 OCTET_MIXED_TUNE=$tune OCTET_SELFTEST_ONLY=mixed
done
tuned() {  # ROUND TUNE M
  OCTET_MIXED_TUNE=$2 timeout 100 $B bench mixed --device cuda --m $3 --kn 4096x4096 > $R/mixed-$1-$2.txt 2>&1
  echo "== round $1 tune $2 rc=$? ($((SECONDS-t0)) s)"
  echo "back to back (DRAM): $(tiled_vs_row $R/mixed-$1-$2.txt)"
  l2_rows $R/mixed-$1-$2.txt | sed 's/^/L2-resident, /'
}
for round in 1 2; do
  if [ $round = 1 ]; then order="0 1"; else order="1 0"; fi
  for p in $order; do tuned $round 2:8:2:2:1:$p 12,16; done
  for p in $order; do tuned $round 2:4:3:1:0:$p 16; done
  for p in $order; do tuned $round 1:8:2:1:0:$p 8; done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
