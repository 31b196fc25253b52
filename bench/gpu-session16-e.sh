#!/usr/bin/env bash
# Sixteenth session, fifth H100 call ($OUT set; carry dev-bin): the 16-token
# small-M kernel with its registers as the compiler picks them (dev-bin/octet,
# 86) or held to 3 blocks an SM (dev-bin/octet-lb3, 80 with 24 bytes of
# spill), and weight loads that skip L1 (OCTET_MIXED_NA=1) or not.
# Selftest of the lb3 binary with the L1-skipping loads; bench mixed alternated.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
OCTET_MIXED_NA=1 timeout 200 dev-bin/octet-lb3 selftest --device cuda > /tmp/r/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
i=0
for v in base lb3 base-na lb3-na lb3-plain base lb3 base-na lb3-na lb3-plain; do
  i=$((i+1))
  case $v in base) b=octet; e="X=1";; lb3) b=octet-lb3; e="X=1";; base-na) b=octet; e="OCTET_MIXED_NA=1";; lb3-na) b=octet-lb3; e="OCTET_MIXED_NA=1";; lb3-plain) b=octet-lb3; e="OCTET_MIXED_PDL=0";; esac
  env $e timeout 100 dev-bin/$b bench mixed --device cuda --m 1,4,16 --json /tmp/r/mixed-$i-$v.json > /tmp/r/mixed-$i-$v.txt 2>&1
  echo "== $i [$v] ($((SECONDS-t0)) s)"; grep "graph" /tmp/r/mixed-$i-$v.txt | grep -v "bf16\|vs the same\|copy d2d" | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/weights back to back in a graph/b2b/; s/read-only pass over one weight.s codes/read/; s/back to back in a graph/b2b/' | awk '{$NF=""; print}' | sed 's/  */ /g'
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
