#!/usr/bin/env bash
# Twenty-first session, fifth call ($OUT set; carry dev-bin): the fused LoRA
# cast kernels (`lora_cast_du_{e5m2,e4m3}_r*`) with 8 warps a block
# (dev-bin/octet-w8, built with CD_WARPS 8 and 256 threads; not kept) against 4
# (dev-bin/octet, 76ae9a1).
# - `octet selftest --device cuda` on the 8-warp binary;
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base 4 / 8 warps
#   alternated twice, bf16 base between;
# - ncu's time of every kernel of a 2-step FP8-base run (8 warps).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet-w8 $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora l-fp8-w4-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-w8 lora l-fp8-w8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
echo "lora ($((SECONDS-t0)) s)"
timeout 150 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
  dev-bin/octet-w8 lora --device cuda --model 1b --batch 4 --seq 2048 --steps 2 --eval-batches 0 --sample-tokens 0 \
  --no-save $fp8 --out-dir /tmp/runs --name n-fp8 > $R/ncu-lora-fp8.csv 2> $R/ncu-lora-fp8.err
echo "== ncu lora fp8 w8 ($((SECONDS-t0)) s)"
python3 bench/kernel_table.py octet $R/ncu-lora-fp8.csv | head -45
gzip -f $R/ncu-lora-fp8.csv
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
