#!/usr/bin/env bash
# Fifteenth session, fourth H100 call ($OUT set; carry dev-bin): the small-M
# weight-only kernel with 16 warps a block splitting K (dev-bin/octet) against
# HEAD's 8 (dev-bin/octet-old): selftest of the new binary; `bench mixed --m 1,4,16`
# new, old, new, old; generate on the ~1B model.
set -uo pipefail
t0=$SECONDS
timeout 200 dev-bin/octet selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
i=0
for bin in octet octet-old octet octet-old; do
  i=$((i+1))
  timeout 120 dev-bin/$bin bench mixed --device cuda --m 1,4,16 --json $OUT/mixed-$i-$bin.json > /tmp/m.txt 2>&1
  echo "== $bin ($((SECONDS-t0)) s)"; grep -E "back to back, vs|M=(1|4|16) " /tmp/m.txt | grep -v "gemm" | awk '{print $5, $6, $7, $(NF-5), $(NF-2)}'
done
for bin in octet octet-old; do
  timeout 100 dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 2>&1 | tail -2 | sed "s/^/$bin /"
done
echo "done ($((SECONDS-t0)) s)"
