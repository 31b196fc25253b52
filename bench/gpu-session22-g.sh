#!/usr/bin/env bash
# Twenty-second session, seventh call ($OUT set; carry dev-bin: octet = the
# d_A kernel with 4 warp groups up to rank 32, 12 stages, one permute a code
# pair; octet-prev = 34719ec, call f's binary):
# - `octet selftest --device cuda`;
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base (quantized
#   backward, FP8 saved activations) new and prev, and the bf16 base,
#   alternated twice;
# - ncu of the d_A kernels: durations, and for the first two launches the
#   warp states and memory workload (where the time goes).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora g-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-prev lora g-fp8prev-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora g-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
echo "lora ($((SECONDS-t0)) s)"
timeout 100 /usr/local/cuda/bin/ncu --kernel-name regex:lora_da -c 8 --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  dev-bin/octet lora --device cuda --model 1b --batch 4 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
  --no-save $fp8 --out-dir /tmp/runs --name n-da > $R/ncu-da.txt 2>&1
grep -E "lora_da|gpu__time|dram__" $R/ncu-da.txt | sed 's/   */ /g' | head -30
timeout 120 /usr/local/cuda/bin/ncu --kernel-name regex:lora_da_e4m3 -c 2 --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats --section ComputeWorkloadAnalysis \
  dev-bin/octet lora --device cuda --model 1b --batch 4 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
  --no-save $fp8 --out-dir /tmp/runs --name n-da2 > $R/ncu-da-detail.txt 2>&1
grep -vE "^==PROF==|^ *-+ *$" $R/ncu-da-detail.txt | sed 's/   */ /g' | grep -E "lora_da|Stall|stall|Warp Cycles|Issued|Eligible|Active Warps|Throughput|Hit Rate|Bank|Executed Ipc|Pipe|One or More|No Eligible" | head -60
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
