#!/usr/bin/env bash
# (The 32-row kernel was dropped after this call: no faster; see BENCHMARKS.md, seventeenth session.)
# Seventeenth session ($OUT set; carry dev-bin): the 32-rows-a-block small-M
# kernel (`mixed_rows32`, groups of 9-16 tokens).
# - selftest (default choice of kernel), then again with OCTET_MIXED_R32=1
#   (the 32-row kernel for every M > 8, partial tiles included);
# - bench mixed at M = 16, alternating OCTET_MIXED_R32=0 (16 rows a block),
#   unset (32 rows where the grid fills the device twice) and =1 (32 rows always).
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
timeout 200 dev-bin/octet selftest --device cuda > /tmp/r/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
OCTET_MIXED_R32=1 timeout 200 dev-bin/octet selftest --device cuda > /tmp/r/selftest-r32.txt 2>&1; echo "selftest r32=1 rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest-r32.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
grep -E "mixed .* m=(9|12|16|17|40|64) " /tmp/r/selftest-r32.txt | sed 's/  */ /g' | cut -c1-160 | head -12
for r in 0 def 1 0 def 1; do
  if [ $r = def ]; then unset OCTET_MIXED_R32; else export OCTET_MIXED_R32=$r; fi
  timeout 100 dev-bin/octet bench mixed --device cuda --m 9,16 > /tmp/r/mixed-$r.txt 2>&1
  echo "== OCTET_MIXED_R32=$r rc=$? ($((SECONDS-t0)) s)"
  grep -E "^mixed.*(graph|M=16 )" /tmp/r/mixed-$r.txt | grep -v "vs the same" | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/weights back to back in a graph/b2b/' | awk '{$NF=""; print}' | sed 's/  */ /g'
  cat /tmp/r/mixed-$r.txt >> /tmp/r/mixed-all.txt
done
unset OCTET_MIXED_R32
grep -E "^(copy|read)" /tmp/r/mixed-def.txt | sed 's/  */ /g'
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
