#!/usr/bin/env bash
# Thirteenth session, third H100 call ($OUT set; carry dev-bin): the vectorized
# RMSNorm forward, the norm backward's 32-row groups, the unrolled gain sums
# and the dq kernel's early RoPE angles, against the binary before them
# (dev-bin/octet-old, d4403e0):
# - selftest of the new binary;
# - ncu of those kernels in one bf16 step at batch 16, new and old;
# - the ~1B model at batch 16 (1b schedule, both binaries), bf16 and
#   tensorwise quantized with FP8 saved activations, alternated.
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
timeout 300 $new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
grep -E "32 rows a block|fused bf16" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200
for bin in octet octet-old; do
  timeout 150 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    --kernel-name regex:"rmsnorm|sum_partials|attn_dq" --launch-count 200 \
    dev-bin/$bin train --device cuda --model 1b --batch 16 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe bf16 --backward high_precision --out-dir /tmp/runs --name ncu > $OUT/ncu-c-$bin.csv 2>/dev/null
  echo "== ncu $bin ($((SECONDS-t0)) s)"
  python3 bench/ncu_kernels.py $OUT/ncu-c-$bin.csv
done
. bench/session12_runs.sh
for cfg in "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  for bin in $new $old $new $old; do
    run1b $bin train c-$(basename $bin)-$1-$2 16 10 4 --recipe $1 --backward $2 --saved-activations $3
  done
done
echo "done ($((SECONDS-t0)) s)"
