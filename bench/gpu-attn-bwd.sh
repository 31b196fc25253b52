#!/usr/bin/env bash
# The wgmma backward with one or two warpgroups a block ($OUT set): the
# attention conformance cases with one, then both benches. Needs the binary of
# commit 7512990: the review removed the two-warpgroup kernels and this switch.
set -uo pipefail
bin=${BIN:-dev-bin/octet}
OCTET_ATTN_BWD_WG=1 timeout 300 $bin selftest --device cuda > $OUT/selftest-bwd1.txt 2>&1; echo "selftest (1 warpgroup) rc=$?"
grep -E "FAIL|attention fwd|all .* cases" $OUT/selftest-bwd1.txt | cut -c1-200
shapes=4x2048x16x128,1x8192x16x128,4x2048x32x64
for n in 1 2; do
  echo "-- backward, $n warpgroup(s) a block"
  OCTET_ATTN_BWD_WG=$n $bin bench attention --device cuda --shapes $shapes --json $OUT/attn-bwd$n.json 2>&1 | tee $OUT/attn-bwd$n.txt | grep backward
done
