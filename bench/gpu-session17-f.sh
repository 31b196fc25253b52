#!/usr/bin/env bash
# (Dropped after this call: slower on two weights, equal on the third; see BENCHMARKS.md, seventeenth session.)
# Seventeenth session ($OUT set; carry dev-bin): the 16-token small-M kernel
# with x loaded at the top of each block (not a block ahead) and at most 64
# registers (four blocks an SM instead of two): selftest, then bench mixed at
# M = 9, 16 against the session's starting binary (dev-bin/octet-old), alternated.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
timeout 200 dev-bin/octet selftest --device cuda > /tmp/r/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
for b in octet octet-old octet octet-old; do
  timeout 60 dev-bin/$b bench mixed --device cuda --m 9,16 > /tmp/r/mixed-$b.txt 2>&1
  echo "== $b rc=$? ($((SECONDS-t0)) s)"
  grep -E "^mixed.*graph" /tmp/r/mixed-$b.txt | grep -v "vs the same" | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/weights back to back in a graph/b2b/' | awk '{$NF=""; print}' | sed 's/  */ /g'
  grep -E "^gemm.*graph" /tmp/r/mixed-$b.txt | sed 's/  */ /g' | cut -c1-120
  cat /tmp/r/mixed-$b.txt >> /tmp/r/mixed-all.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
