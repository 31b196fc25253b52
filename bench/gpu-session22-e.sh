#!/usr/bin/env bash
# Twenty-second session, fifth call ($OUT set; carry dev-bin: octet = the
# d_A kernel with 12 stages in dynamic shared memory and the reduce unrolled,
# octet-v3 = bf05775, the committed kernel with 6-8 static stages):
# - `octet selftest --device cuda`;
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base (quantized
#   backward, FP8 saved activations) new/v3 alternated twice, bf16 base between;
# - ncu of the d_A kernels;
# - issue 5's loss target in the same FP8 setting: the default small model,
#   300 steps bf16, then LoRA on its checkpoint with --compare-bf16,
#   quantized backward, FP8 saved activations, 200 steps.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora e-fp8-new-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-v3 lora e-fp8-v3-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora e-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
echo "lora ($((SECONDS-t0)) s)"
timeout 100 /usr/local/cuda/bin/ncu --kernel-name regex:lora_da -c 8 --section SpeedOfLight --section LaunchStats --section Occupancy \
  dev-bin/octet lora --device cuda --model 1b --batch 4 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
  --no-save $fp8 --out-dir /tmp/runs --name n-da > $R/ncu-da.txt 2>&1
grep -E "lora_da|Duration|DRAM Throughput|Registers Per|Achieved Occ" $R/ncu-da.txt | head -50
dev-bin/octet train --device cuda --recipe bf16 --sample-tokens 0 --out-dir /tmp/runs --name s-bf16 > $R/train-small.txt 2>&1
echo "train small rc=$? ($((SECONDS-t0)) s)"
ck=$(ls -d /tmp/runs/s-bf16/checkpoints/step_* | sort -t_ -k2 -n | tail -1)
dev-bin/octet lora --device cuda --base "$ck" --compare-bf16 --backward quantized --saved-activations fp8 --steps 200 \
  --sample-tokens 0 --no-save --out-dir /tmp/runs --name lc > $R/lora-compare.txt 2>&1
echo "lora compare rc=$? ($((SECONDS-t0)) s)"; tail -9 $R/lora-compare.txt
cp /tmp/runs/lc-compare-bf16.png $R/ 2>/dev/null
cp /tmp/runs/lc/metrics.jsonl $R/lc-fp8base.jsonl; cp /tmp/runs/lc-bf16base/metrics.jsonl $R/lc-bf16base.jsonl
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
