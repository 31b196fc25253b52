#!/usr/bin/env bash
# Sixteenth session, second H100 call ($OUT set; carry dev-bin): the
# back-to-back small-M rows now replay a CUDA graph (no host launch cost);
# launch options of the small-M kernel (OCTET_MIXED_LAUNCH) alternated.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
i=0
for v in "" pdl pdl,early "" pdl pdl,early; do
  i=$((i+1))
  OCTET_MIXED_LAUNCH=$v timeout 100 dev-bin/octet bench mixed --device cuda --m 1,4,16 --json /tmp/r/mixed-$i.json > /tmp/r/mixed-$i.txt 2>&1
  echo "== $i [$v] ($((SECONDS-t0)) s)"; grep -E "in a graph|M=(1|4|16) " /tmp/r/mixed-$i.txt | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/gemm bf16 cuBLASLt/bf16/; s/weights back to back in a graph/b2b graph/' | awk '{$NF=""; print}' | sed 's/  */ /g'
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
