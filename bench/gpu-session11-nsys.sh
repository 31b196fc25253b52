#!/usr/bin/env bash
# Per-kernel GPU time of the ~1B LoRA step (nsys), FP8 base vs bf16 base; $OUT set by the device tool.
set -uo pipefail
bin=dev-bin/octet
NSYS=/opt/nvidia/nsight-compute/2025.3.1/host/target-linux-x64/nsys
echo "nsys: $NSYS"
for cfg in "fp8-tensorwise fp8 quantized" "bf16 bf16 high_precision"; do
  set -- $cfg
  echo "-- lora base $1, compute $2, backward $3"
  $NSYS profile -o /tmp/p-$1 --force-overwrite true -t cuda --capture-range=none \
    $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 5 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name n-$1 > /tmp/log-$1.txt 2>&1
  tail -3 /tmp/log-$1.txt
  $NSYS stats --report cuda_gpu_kern_sum --format csv /tmp/p-$1.nsys-rep > $OUT/kern-$1.csv 2>/dev/null
  head -40 $OUT/kern-$1.csv | cut -c1-200
done
if [ ! -s "$OUT/kern-bf16.csv" ]; then
  echo "== nsys gave nothing: ncu, one step's kernels (skip the first 2 steps)"
  for cfg in "fp8-tensorwise fp8 quantized" "bf16 bf16 high_precision"; do
    set -- $cfg
    /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv --launch-skip 1800 --launch-count 900 \
      $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 4 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name n-$1 > $OUT/ncu-$1.csv 2>/dev/null
    wc -l $OUT/ncu-$1.csv
  done
fi
