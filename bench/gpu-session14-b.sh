#!/usr/bin/env bash
# Fourteenth session, second H100 call ($OUT set; carry dev-bin): the
# warp-specialized forward with ping-pong between its two consumers, against
# OCTET_ATTN_FWD=wg; blockwise with k padded to 128 on the small model.
set -uo pipefail
t0=$SECONDS
bin=dev-bin/octet
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
grep -E "block-scaled" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-160
for k in ws wg ws wg; do
  echo "== bench attention, forward $k ($((SECONDS-t0)) s)"
  OCTET_ATTN_FWD=$k timeout 120 $bin bench attention --device cuda --shapes 4x2048x16x128,16x2048x16x128 2>&1 | grep forward
done
. bench/session12_runs.sh
for k in ws wg ws wg; do
  OCTET_ATTN_FWD=$k run1b $bin train s14b-tw-$k 16 10 4 --recipe tensorwise
done
echo "== compare, small model, bf16 and blockwise ($((SECONDS-t0)) s)"
timeout 300 $bin compare --device cuda --recipes bf16,blockwise \
  --out-dir /tmp/cmp --name small > $OUT/compare-small.txt 2>&1; echo "compare rc=$?"
tail -6 $OUT/compare-small.txt
echo "done ($((SECONDS-t0)) s)"
