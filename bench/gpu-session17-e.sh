#!/usr/bin/env bash
# Seventeenth session ($OUT set; carry dev-bin): why are 9-16 tokens slower
# than 8 in the small-M kernel? ncu's warp-state, scheduler, occupancy and
# memory sections of one launch of the 8-token (n8) and the 16-token (n16)
# kernel on the 8192x28672 weight (`octet bench mixed --m 8,16`).
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
for k in n8 n16; do
  timeout 150 /usr/local/cuda/bin/ncu --clock-control none -k regex:mixed_e4m3_${k}_bf16 --launch-skip 10 --launch-count 1 \
    --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
    --section MemoryWorkloadAnalysis --section SpeedOfLight \
    dev-bin/octet bench mixed --device cuda --m 8,16 --kn 8192x28672 > /tmp/r/ncu-$k.txt 2>&1
  echo "== $k rc=$? ($((SECONDS-t0)) s)"
  grep -E "Duration|Throughput|Registers|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|L1/TEX Hit|L2 Hit|Stall|stall" /tmp/r/ncu-$k.txt | sed 's/  */ /g' | head -40
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
