#!/usr/bin/env bash
# Sixteenth session, final H100 call ($OUT set; carry dev-bin): HEAD's binary
# (small-M kernel: dependent launch, weight loads without L1 allocation).
# Selftest; bench mixed at M = 1, 4, 16, 2048 twice (the second with the plain
# launch, OCTET_MIXED_PDL=0); generate on the ~1B model.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
timeout 200 dev-bin/octet selftest --device cuda > /tmp/r/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
timeout 150 dev-bin/octet bench mixed --device cuda --m 1,4,16,2048 --json /tmp/r/mixed-cuda.json > /tmp/r/mixed-cuda.txt 2>&1
echo "bench mixed rc=$? ($((SECONDS-t0)) s)"; grep -E "^(copy|read|mixed|gemm)" /tmp/r/mixed-cuda.txt | grep -v "vs the same" | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/weights back to back in a graph/b2b/; s/read-only pass over one weight.s codes/read/; s/gemm bf16 cuBLASLt/bf16/' | awk '{$NF=""; print}' | sed 's/  */ /g'
OCTET_MIXED_PDL=0 timeout 100 dev-bin/octet bench mixed --device cuda --m 1,4,16 --json /tmp/r/mixed-cuda-plain.json > /tmp/r/mixed-cuda-plain.txt 2>&1
echo "== plain launch ($((SECONDS-t0)) s)"; grep "b2b\|in a graph" /tmp/r/mixed-cuda-plain.txt | grep "^mixed" | grep -v "vs the same" | sed 's/mixed fp8 e4m3 per-channel/fp8/; s/weights back to back in a graph/b2b/' | awk '{$NF=""; print}' | sed 's/  */ /g'
timeout 100 dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > /tmp/r/generate.txt 2>&1; tail -3 /tmp/r/generate.txt
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
