#!/usr/bin/env bash
# Forty-sixth session, H200 (carry dev-bin: octet.gz = HEAD). f16 x now takes the
# few-block 16-token shape only where the wide shapes go; on the H200 they do, so its
# figures should not move. This checks that: the device line, the full selftest, the
# weight-only selftest under OCTET_MIXED_WIDE=0, and the 4096x4096 / 4096x14336 table
# at the default and under OCTET_MIXED_WIDE=0, one round each, with L2-resident rows.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
dev_bin /tmp/r46a
{
gpu_line
timed_selftest selftest selftest.txt 300
timed_selftest "mixed selftest wide=0" selftest-wide0.txt 200 OCTET_MIXED_WIDE=0 OCTET_SELFTEST_ONLY=mixed
for r in "1 default" "1 0"; do
  wide_round $r --m 1,8,12,16 --kn 4096x4096,4096x14336
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
