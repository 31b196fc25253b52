#!/usr/bin/env bash
# Sixteenth session, first H100 call ($OUT set; carry dev-bin): launch
# options of the small-M weight-only kernel (OCTET_MIXED_LAUNCH: programmatic
# dependent launch, L2 prefetch at the start, L2 prefetch ahead in the loop).
# Selftest under the dependent launch; `bench mixed --m 1,4,16` per variant;
# generate on the ~1B model, plain and dependent.
set -uo pipefail
t0=$SECONDS
OCTET_MIXED_LAUNCH=pdl,pf=24,ahead=16 timeout 200 dev-bin/octet selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
i=0
for v in "" pdl pdl,early pf=24 pdl,pf=24 ahead=16 pdl,ahead=16 pdl,pf=24,ahead=16 ""; do
  i=$((i+1))
  OCTET_MIXED_LAUNCH=$v timeout 100 dev-bin/octet bench mixed --device cuda --m 1,4,16 --json $OUT/mixed-$i.json > $OUT/mixed-$i.txt 2>&1
  echo "== $i [$v] ($((SECONDS-t0)) s)"; grep -E "back to back, vs|M=(1|4|16) " $OUT/mixed-$i.txt | grep -v "gemm" | awk '{print $5, $6, $7, $(NF-5), $(NF-2)}'
done
for v in "" pdl,pf=24; do
  OCTET_MIXED_LAUNCH=$v timeout 100 dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 2>&1 | tail -2 | sed "s/^/[$v] /"
done
echo "done ($((SECONDS-t0)) s)"
