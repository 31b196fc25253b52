#!/usr/bin/env bash
# Sixteenth session, fourth H100 call ($OUT set; carry dev-bin): the 16-token
# small-M kernel over 32 rows a block (two row tiles, four warps each along
# K, sharing x's loads; OCTET_MIXED_R32_N=0) against 16 rows (default), both
# dependent launches; and the plain launch (OCTET_MIXED_PDL=0).
# Selftest with the 32-row kernel; bench mixed per variant, alternated.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
OCTET_MIXED_R32_N=0 timeout 200 dev-bin/octet selftest --device cuda > /tmp/r/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
i=0
for v in r16 r32 r16 r32 plain r32 r16 plain; do
  i=$((i+1))
  case $v in r16) e="";; r32) e="OCTET_MIXED_R32_N=0";; plain) e="OCTET_MIXED_PDL=0";; esac
  env $e timeout 100 dev-bin/octet bench mixed --device cuda --m 1,4,16 --json /tmp/r/mixed-$i-$v.json > /tmp/r/mixed-$i-$v.txt 2>&1
  echo "== $i [$v] ($((SECONDS-t0)) s)"; grep -E "in a graph|M=(1|4|16) " /tmp/r/mixed-$i-$v.txt | grep -v "bf16\|vs the same\|copy d2d" | grep "graph" | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/weights back to back in a graph/b2b graph/' | awk '{$NF=""; print}' | sed 's/  */ /g'
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
