#!/usr/bin/env bash
# Twentieth session, sixth call ($OUT set; carry dev-bin): the small-M
# weight-only kernel accumulating straight into its totals where there are no
# block scales (dev-bin/octet) against the kernel that sums each 128-column
# block apart first (dev-bin/octet-old): selftest, then `octet bench mixed`
# at M = 8 and 16 on the three weights, old and new alternated twice.
# (No faster; the kernel change was reverted after this call, see NOTES.md.)
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin bench mixed --device cuda --m 8,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$bin-$rep.txt 2>&1
    echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "graph, vs the same-size copy" $R/mixed-$bin-$rep.txt | sed 's/   */ /g' | cut -c1-220
  done
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
