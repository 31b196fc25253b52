#!/usr/bin/env bash
# Thirteenth session, first H100 call ($OUT set; carry dev-bin):
# - the selftest of the new binary (the fused bf16 + RoPE store of the
#   attention backward against the f32 kernels + passes, bit for bit; the
#   small-M weight-only kernel at 2, 4 and 8 warps a block);
# - `bench mixed` at M = 1, 4, 16 with the block size the host picks and
#   with each of 2, 4, 8 forced (OCTET_MIXED_WARPS);
# - the ~1B model at batch 16: bf16 and tensorwise (FP8 saved), new against
#   the session's starting binary (dev-bin/octet-old), 10 steps each;
# - the 1b preset's new schedule: 200 steps at batch 4, bf16, losses.
# (OCTET_MIXED_WARPS selected 2, 4 or 8 warps a block in the binary of this call;
# those variants were dropped after it: crates/octet-cuda/NOTES.md.)
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
timeout 400 $new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-240 | tail -12
grep -E "fused bf16" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-240
for w in auto 2 4 8; do
  echo "== bench mixed, warps $w ($((SECONDS-t0)) s)"
  env $( [ $w != auto ] && echo OCTET_MIXED_WARPS=$w ) timeout 150 $new bench mixed --device cuda --m 1,4,16 \
    --json $OUT/mixed-w$w.json > $OUT/mixed-w$w.txt 2>&1; echo "rc=$?"
  grep -E "M=|copy" $OUT/mixed-w$w.txt | sed 's/  */ /g' | cut -c1-150
done
. bench/session12_runs.sh
for cfg in "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  for bin in $new $old $new; do
    run1b $bin train a-$(basename $bin)-$1-$2 16 10 4 --recipe $1 --backward $2 --saved-activations $3
  done
done
echo "== 1b preset schedule, bf16, batch 4, 200 steps ($((SECONDS-t0)) s)"
$new train --device cuda --model 1b --recipe bf16 --backward high_precision --batch 4 --seq 2048 --steps 200 \
  --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs --name lr1b > $OUT/lr1b.txt 2>&1; echo "rc=$?"
cp /tmp/runs/lr1b/metrics.jsonl $OUT/lr1b-metrics.jsonl 2>/dev/null
python3 - <<'PY'
import json
rows = [json.loads(l) for l in open("/tmp/runs/lr1b/metrics.jsonl") if '"loss"' in l]
print("losses:", [round(r["loss"], 3) for r in rows[:12]], "...", [round(r["loss"], 3) for r in rows[-5:]])
print("max loss after step 1:", max(r["loss"] for r in rows[1:]), "every 20th:", [round(r["loss"], 3) for r in rows[::20]])
PY
echo "done ($((SECONDS-t0)) s)"
