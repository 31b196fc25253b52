#!/usr/bin/env bash
# Sixteenth session, third H100 call ($OUT set; carry dev-bin): the small-M
# kernel with 32 weight rows a block (two tiles sharing x's loads) above
# r32=<M> tokens, under the dependent launch; the read-only floor row.
# Selftest with the 32-row kernel at every M; bench mixed per variant, twice;
# generate, plain launch and dependent launch.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
OCTET_MIXED_LAUNCH=pdl,early,r32=0 timeout 200 dev-bin/octet selftest --device cuda > /tmp/r/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
i=0
for v in pdl,early pdl,early,r32=8 pdl,early,r32=0 "" pdl,early pdl,early,r32=8 pdl,early,r32=0 ""; do
  i=$((i+1))
  OCTET_MIXED_LAUNCH=$v timeout 100 dev-bin/octet bench mixed --device cuda --m 1,4,16 --json /tmp/r/mixed-$i.json > /tmp/r/mixed-$i.txt 2>&1
  echo "== $i [$v] ($((SECONDS-t0)) s)"; grep -E "in a graph|M=(1|4|16) " /tmp/r/mixed-$i.txt | grep -v "bf16\|vs the same" | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/weights back to back in a graph/b2b graph/' | awk '{$NF=""; print}' | sed 's/  */ /g'
done
for v in "" pdl,early; do
  OCTET_MIXED_LAUNCH=$v timeout 100 dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 2>&1 | tail -2 | sed "s/^/[$v] /"
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
