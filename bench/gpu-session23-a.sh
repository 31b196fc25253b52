#!/usr/bin/env bash
# Twenty-third session, first call ($OUT set; carry dev-bin: octet = the d_A
# kernel with its reduction inside (grid barrier, cooperative launch) and each
# adapter's rows written to its own output; octet-prev = 5103e39, the
# separate reduce kernel and per-adapter copies):
# - `octet selftest --device cuda`;
# - ncu (clocks unlocked) durations of the d_A kernels of one step's first
#   launches, both binaries;
# - ~1B LoRA step, FP8 base new/prev alternated twice, bf16 base between.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for b in octet octet-prev; do
  timeout 100 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:lora_da -c 10 \
    --metrics gpu__time_duration.sum \
    dev-bin/$b lora --device cuda --model 1b --batch 4 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
    --no-save $fp8 --out-dir /tmp/runs --name n-$b > $R/ncu-$b.txt 2>&1
  echo "== $b"; grep -E "lora_da|gpu__time" $R/ncu-$b.txt | sed 's/   */ /g' | grep -v "^ *$" | head -24
done
for rep in 1 2; do
  run1b dev-bin/octet lora a-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-prev lora a-fp8prev-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora a-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
