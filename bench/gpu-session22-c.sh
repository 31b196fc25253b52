#!/usr/bin/env bash
# Twenty-second session, third call (the d_A kernel: two groups of 4 warps
# taking alternate steps, codes to bf16 on the integer and FMA pipes) ($OUT set; carry dev-bin: octet = the
# working tree with d_A from the adapters' E4M3 input codes, octet-old =
# 9961cb8's binary): selftest; the ~1B LoRA step (batch 4 x 2048, r 16 on all
# seven) with the FP8 base (quantized backward, FP8 saved activations: now
# the adapters' inputs too) against the bf16 base, new and old binaries
# alternated; the dequantized backward's peak; ncu's kernel times of a
# 2-step FP8-base run.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
run_selftest dev-bin/octet $R/selftest.txt
grep -E "d_A from E4M3|keeping the input|FP8 saved activations" $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
deq="--base-format fp8-tensorwise --compute fp8 --backward dequantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora c-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-old lora c-fp8old-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora c-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
run1b dev-bin/octet lora c-deq 4 8 3 $deq | tee -a $R/lora.txt
timeout 100 /usr/local/cuda/bin/ncu --kernel-name regex:lora_da -c 8 --section SpeedOfLight --section LaunchStats --section Occupancy \
  dev-bin/octet lora --device cuda --model 1b --batch 4 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
  --no-save $fp8 --out-dir /tmp/runs --name n-da > $R/ncu-da.txt 2>&1
grep -E "lora_da|Duration|DRAM Throughput|Compute .SM. Thr|Registers Per|Achieved Occ" $R/ncu-da.txt | head -80
echo "steps ($((SECONDS-t0)) s)"
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
