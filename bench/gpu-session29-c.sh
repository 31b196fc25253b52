#!/usr/bin/env bash
# Twenty-ninth session, call c ($OUT set; carry dev-bin: octet = call b's).
# Why 16 tokens read at 0.70 of copy on 4096x4096 where 1 token reads 0.83:
# ncu's speed-of-light, memory, warp-state and occupancy sections of one
# small-M launch each (the sixth of the run), 4096x4096 M = 1 and 16,
# 8192x28672 M = 16, and M = 16 with 32 rows and 8 warps (OCTET_MIXED_TUNE=2:2:8:2).
set -uo pipefail
t0=$SECONDS
R=$OUT/r; mkdir -p $R
prof() {  # NAME M KN [env...]
  local name=$1 m=$2 kn=$3; shift 3
  env "$@" timeout 200 ncu --clock-control none --cache-control none --kernel-name regex:mixed_e4m3_ \
    --launch-skip 5 --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats \
    dev-bin/octet bench mixed --device cuda --m $m --kn $kn > $R/ncu-$name.txt 2>&1
  echo "== $name rc=$? ($((SECONDS-t0)) s)"
  grep -E "Duration|DRAM Throughput|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|Compute \(SM\)|Stall|Warp Cycles Per Issued|Issued Warp|No Eligible|Active Warps Per|Achieved Occupancy|Registers Per|Dynamic Shared|Block Size|Grid Size|Mem Busy|Max Bandwidth|Mem Pipes" $R/ncu-$name.txt | sed 's/   */ /g'
}
{
prof m1-4096 1 4096x4096
prof m16-4096 16 4096x4096
prof m16-4096-r32w8 16 4096x4096 OCTET_MIXED_TUNE=2:2:8:2
prof m16-8192 16 8192x28672
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
