#!/usr/bin/env bash
# Thirteenth session, second H100 call ($OUT set; carry dev-bin), after the
# fused store's table loads were batched:
# - selftest (the fused store bit for bit against the f32 kernels + passes);
# - `bench attention` (4 x 2048, 16 heads of 128), new and old binary;
# - ncu of the attention kernels of one tensorwise step, new binary;
# - the ~1B model at batch 16, new against old with the same schedule
#   (--lr 3e-3 --warmup 30, the old binary's default for every preset),
#   bf16 and tensorwise quantized with FP8 saved activations, alternated.
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
timeout 300 $new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-240 | tail -12
grep -E "fused bf16" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-240
for bin in $new $old; do
  echo "== bench attention $bin"
  $bin bench attention --device cuda 2>&1 | grep -E "attention" | sed 's/  */ /g' | cut -c1-160
done
timeout 120 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --kernel-name regex:"attn" --launch-count 64 \
  $new train --device cuda --model 1b --batch 16 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 --no-save \
  --recipe tensorwise --backward quantized --saved-activations fp8 --out-dir /tmp/runs --name ncu > $OUT/ncu-attn.csv 2>/dev/null
python3 bench/ncu_kernels.py $OUT/ncu-attn.csv
echo "ncu done ($((SECONDS-t0)) s)"
. bench/session12_runs.sh
for cfg in "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  for bin in $new $old $new $old; do
    run1b $bin train b-$(basename $bin)-$1-$2 16 10 4 --recipe $1 --backward $2 --saved-activations $3 --lr 3e-3 --warmup 30
  done
done
echo "done ($((SECONDS-t0)) s)"
