#!/usr/bin/env bash
# Twenty-fifth session, second call ($OUT set; carry dev-bin): ncu on one
# launch of the small-M kernel at 4096x14336 (K x N), M = 8 (n8) and 16 (n16,
# the committed shape and r2k2s3, x shared by two row tiles): speed of light,
# memory, occupancy, scheduler, warp states, instruction mix.
set -uo pipefail
t0=$SECONDS
R=$OUT/r
mkdir -p $R
NCU=/usr/local/cuda/bin/ncu
S="--section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats --section ComputeWorkloadAnalysis"
prof() { # NAME M KERNEL_REGEX [env...]
  local name=$1 m=$2 k=$3
  shift 3
  env "$@" $NCU $S --print-details all -k "regex:$k" -s 2 -c 1 dev-bin/octet bench mixed --device cuda --m $m --kn 4096x14336 --reps 1 \
    > $R/ncu-$name.txt 2>&1
  echo "$name rc=$? ($((SECONDS-t0)) s)"
  grep -E "DRAM Throughput|Duration|Issue Slots Busy|Achieved Occupancy|Theoretical Occupancy|Registers Per|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|Executed Ipc A|L2 Cache Throughput|L1/TEX Cache Throughput|Block Limit" $R/ncu-$name.txt
}
prof n8 8 "mixed_e4m3_n8_" OCTET_MIXED_PDL=1
prof n16 16 "mixed_e4m3_n16_" OCTET_MIXED_PDL=1
prof n16r2k2s3 16 "mixed_e4m3_n16r2k2s3_" OCTET_MIXED_SMALL=16:r2k2s3
prof n12 12 "mixed_e4m3_n16_" OCTET_MIXED_PDL=1
echo "done ($((SECONDS-t0)) s)"
# Result: issue slots 55-60% busy at base clock; SASS showed 186 of the 433 instructions of each k block in the copies' address arithmetic (bench-results/h100-session25-b-ncu-small-m.txt).
