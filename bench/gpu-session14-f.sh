#!/usr/bin/env bash
# Fourteenth session, sixth H100 call ($OUT set; carry dev-bin): the attention
# delta kernel with 4 values a lane and the embedding backward unrolled,
# against the session's starting binary (dev-bin/octet-old, 9719f48):
# - selftest of the new binary;
# - ncu of those two kernels in one bf16 step at batch 16, new and old;
# - the ~1B model at batch 16 (1b schedule), bf16 and tensorwise, alternated.
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
timeout 300 $new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
for bin in octet octet-old; do
  timeout 150 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    --kernel-name regex:"attn_delta|embed_bwd" --launch-count 100 \
    dev-bin/$bin train --device cuda --model 1b --batch 16 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe bf16 --out-dir /tmp/runs --name ncu > /tmp/ncu-$bin.csv 2>/dev/null
  echo "== ncu $bin ($((SECONDS-t0)) s)"
  python3 bench/ncu_kernels.py /tmp/ncu-$bin.csv
done
. bench/session12_runs.sh
for r in bf16 tensorwise; do
  for bin in $new $old $new $old; do
    run1b $bin train f-$(basename $bin)-$r 16 10 4 --recipe $r
  done
done
echo "done ($((SECONDS-t0)) s)"
