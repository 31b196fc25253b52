#!/usr/bin/env bash
# Thirty-fifth session, call a ($OUT set; carry dev-bin: octet.gz = 5a4303d
# plus the uncommitted OCTET_MIXED_EXP hook and three experiments on the
# 16-token bf16 kernel, bench-results/h100-session35-exp.patch):
# - ACC2: odd mma steps accumulate into a second total (HMMA chains halved);
# - XCA: x copies allocate in L1 (cp.async.ca), so the two blocks an SM can
#   share x lines;
# - ALLC: on a launch of at most two blocks an SM, every block's codes are
#   bulk-copied (TMA, one 2 KiB copy a 128-column block, one mbarrier each)
#   into shared memory before griddepcontrol.wait; only x goes through the
#   cp.async ring (4096x4096: 114,944 bytes a block).
# Selftest with all three, then two rounds of each against base.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r35a; mkdir -p $R
{
OCTET_MIXED_EXP=ALLC,ACC2,XCA OCTET_SELFTEST_ONLY=mixed timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=ALLC,ACC2,XCA rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2; do
  for v in base ACC2 XCA ALLC; do
    e="X=1"; [ $v != base ] && e="OCTET_MIXED_EXP=$v"
    env $e timeout 150 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R . 2>/dev/null
