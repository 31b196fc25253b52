#!/usr/bin/env bash
# Twenty-first session, first call ($OUT set; carry dev-bin): where the LoRA
# step's FP8 base spends its time now, and whether grouped GEMMs would pay.
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base (quantized
#   backward, FP8 saved activations), FP8 base with full saved activations,
#   bf16 base;
# - ncu's time of every kernel of a 2-step run of the FP8 and bf16 bases;
# - bench/grouped_gemm_probe.py: the projections' products one by one
#   against grouped, FP8 and bf16 (PyTorch, cuBLAS).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
python3 bench/grouped_gemm_probe.py 2>&1 | tee $R/grouped-gemm.txt
echo "probe ($((SECONDS-t0)) s)"
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora l-fp8-$rep 4 8 3 $fp8 --saved-activations fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-fp8full-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
echo "steps ($((SECONDS-t0)) s)"
for cfg in fp8 bf16; do
  if [ $cfg = fp8 ]; then flags="$fp8 --saved-activations fp8"; else flags="$bf16"; fi
  timeout 150 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    dev-bin/octet lora --device cuda --model 1b --batch 4 --seq 2048 --steps 2 --eval-batches 0 --sample-tokens 0 \
    --no-save $flags --out-dir /tmp/runs --name n-$cfg > $R/ncu-lora-$cfg.csv 2> $R/ncu-lora-$cfg.err
  echo "== ncu lora $cfg ($((SECONDS-t0)) s)"
  python3 bench/kernel_table.py octet $R/ncu-lora-$cfg.csv | head -50
  gzip -f $R/ncu-lora-$cfg.csv
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
