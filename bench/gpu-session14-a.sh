#!/usr/bin/env bash
# Fourteenth session, first H100 call ($OUT set; carry dev-bin): the
# warp-specialized attention forward (attn_fwd_ws, default) against the
# two-warpgroup kernel (OCTET_ATTN_FWD=wg), and blockwise with padded
# 128x128 scale rows:
# - selftest (attention against f64; block GEMMs with k/128 of 3 and 5);
# - bench attention, both forward kernels;
# - the ~1B model at batch 16, 10 steps (1b schedule), bf16 and tensorwise,
#   both kernels alternated (same losses expected: same arithmetic);
# - every recipe on the small model (blockwise included now).
set -uo pipefail
t0=$SECONDS
bin=dev-bin/octet
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
grep -E "128x128|block-scaled" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-160
for k in ws wg; do
  echo "== bench attention, forward $k ($((SECONDS-t0)) s)"
  OCTET_ATTN_FWD=$k timeout 120 $bin bench attention --device cuda --shapes 4x2048x16x128,16x2048x16x128 2>&1 | tail -12
done
. bench/session12_runs.sh
for r in bf16 tensorwise; do
  for k in ws wg ws wg; do
    OCTET_ATTN_FWD=$k run1b $bin train s14a-$r-$k 16 10 4 --recipe $r
    python3 - "$r" "$k" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/runs/s14a-{sys.argv[1]}-{sys.argv[2]}/metrics.jsonl") if '"loss"' in l]
print("   losses", [f"{r['loss']:.6f}" for r in rows if 'loss' in r][-3:])
PY
  done
done
echo "== compare, small model, every recipe ($((SECONDS-t0)) s)"
timeout 400 $bin compare --device cuda --recipes bf16,delayed,tensorwise,rowwise,blockwise,mxfp8,nvfp4 \
  --out-dir /tmp/cmp --name small > $OUT/compare-small.txt 2>&1; echo "compare rc=$?"
tail -14 $OUT/compare-small.txt
cp /tmp/cmp/small-compare.png /tmp/cmp/small-compare.json $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
