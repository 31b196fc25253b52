#!/usr/bin/env bash
# Per-kernel time of one ~1B training step (Nsight Compute, clocks left alone), plus the
# detailed sections of the attention kernels; run on the lent GPU with $OUT set:
#   bash bench/gpu-kernels-profile.sh [selftest]
set -uo pipefail
bin=dev-bin/octet
if [ "${1:-}" = selftest ]; then
  $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
  grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-300
fi
train="$bin train --device cuda --model 1b --batch 4 --seq 2048 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs"
for r in "bf16 high_precision" "tensorwise quantized"; do
  set -- $r
  echo "-- $1 / $2, 6 steps"
  $train --steps 6 --recipe $1 --backward $2 --name t-$1 > $OUT/train-$1.txt 2>&1; tail -6 $OUT/train-$1.txt | cut -c1-200
done
for r in "bf16 high_precision" "tensorwise quantized"; do
  set -- $r
  timeout 280 ncu --clock-control none --metrics gpu__time_duration.sum --csv --print-units base \
    $train --steps 2 --recipe $1 --backward $2 --name n-$1 > $OUT/ncu-step-$1.csv 2> $OUT/ncu-step-$1.err
  echo "ncu $1 rc=$? lines=$(wc -l < $OUT/ncu-step-$1.csv)"
done
timeout 200 ncu --clock-control none -k regex:"attn_(fwd|dkdv|dq)_tc" --launch-skip 63 --launch-count 3 \
  --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
  --section MemoryWorkloadAnalysis --section LaunchStats --section SchedulerStats --section InstructionStats \
  $train --steps 2 --recipe bf16 --name a > $OUT/ncu-attn.txt 2>&1
echo "ncu attn rc=$?"
