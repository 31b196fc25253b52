#!/usr/bin/env bash
# Twenty-third session, fourth call ($OUT set; carry dev-bin: octet = call c's
# binary with the kernels' lists read in place (`__grid_constant__`): AdamW 64
# tensors a launch, gradients added 8 a launch, a group's frozen codes
# transposed in one launch, d_A's destinations; octet-nt = the same without
# the grouped transposes):
# - `octet selftest --device cuda`;
# - ncu (clocks unlocked) durations of one layer's transposes, both binaries,
#   and of the d_A kernels;
# - ~1B LoRA step: FP8 both binaries and bf16, three rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
one="lora --device cuda --model 1b --batch 4 --seq 2048 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs"
for b in octet octet-nt; do
  timeout 100 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:"transpose_u8|lora_da|adamw" -c 20 \
    --metrics gpu__time_duration.sum dev-bin/$b $one --steps 1 $fp8 --name n-$b > $R/ncu-$b.txt 2>&1
  echo "== $b"; grep -E "transpose_u8|lora_da|adamw|gpu__time" $R/ncu-$b.txt | grep -v PROF | sed 's/   */ /g' | grep -v "^ *$" | paste - - | cut -c1-150 | head -20
done
for rep in 1 2 3; do
  run1b dev-bin/octet lora d-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-nt lora d-fp8nt-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora d-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
