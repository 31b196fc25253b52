#!/usr/bin/env bash
# Twenty-fifth session, fifth call ($OUT set; carry dev-bin: HEAD's binary):
# where the 128x128 block-scaled wgmma kernel loses against the per-channel
# one at M = 2048 on 8192x28672. ncu on one launch of each (speed of light,
# pipes, warp states, instruction mix, source counters), then `octet bench
# mixed --m 2048` on the issue's three weights, twice.
set -uo pipefail
t0=$SECONDS
R=$OUT/r
mkdir -p $R
NCU=/usr/local/cuda/bin/ncu
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section Occupancy --section SchedulerStats --section WarpStateStats --section InstructionStats --section LaunchStats --section SourceCounters"
prof() { # NAME KERNEL_REGEX
  $NCU $S --print-details all -k "regex:$2" -s 1 -c 1 dev-bin/octet bench mixed --device cuda --m 2048 --kn 8192x28672 --reps 1 \
    > $R/ncu-$1.txt 2>&1
  echo "$1 rc=$? ($((SECONDS-t0)) s)"
  grep -E "Duration|SM Frequency|Issue Slots Busy|Executed Ipc A|Warp Cycles Per Issued|Executed Instructions  |Tensor \(FP\)|ALU  |FMA  |No Eligible|Stall (Long|Wait|Math|Not Sel|Barrier|Dispatch|Short|GMMA|Branch)|Selected  " $R/ncu-$1.txt | head -40
}
prof channel "mixed_wg_e4m3_bf16"
prof block "mixed_wg_block_e4m3_bf16"
for rep in 1 2; do
  dev-bin/octet bench mixed --device cuda --m 2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-2048-$rep.txt 2>&1
  echo "== rep $rep rc=$? ($((SECONDS-t0)) s)"
  grep -E "M=2048" $R/mixed-2048-$rep.txt | grep -E "speedup|bf16" | sed 's/   */ /g' | head -20
done
echo "done ($((SECONDS-t0)) s)"
# Result: tensor pipe 90-94% busy (per channel) against 83-86% (block); M = 2048 block128 0.94 / 0.94-1.00 / 0.88-0.89x of cuBLASLt bf16.
