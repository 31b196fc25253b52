#!/usr/bin/env bash
# Twenty-first session ($OUT set; carry dev-bin): the LoRA gradient groups
# (q, k, v; gate, up: one E5M2 scale, each gradient multiplied by its base's
# factor, one FP8 GEMM for the group's input gradient; the CPU reference does
# the same) in dev-bin/octet-grp, against dev-bin/octet (f046b3c). Measured,
# no faster (63.9 / 64.6 against 63.9 / 64.5 ms): the change (a patch on
# f046b3c, GPU and CPU) was not committed.
# - `octet selftest --device cuda` on octet-grp;
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base old / grp
#   alternated twice, bf16 base between;
# - the default small model 300 steps (bf16), then LoRA on its checkpoint with
#   --compare-bf16, quantized backward, 200 steps (the 2% loss target).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet-grp $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora l-fp8-old-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-grp lora l-fp8-grp-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
echo "lora ($((SECONDS-t0)) s)"
dev-bin/octet-grp train --device cuda --recipe bf16 --sample-tokens 0 --out-dir /tmp/runs --name s-bf16 > $R/train-small.txt 2>&1
ck=$(ls -d /tmp/runs/s-bf16/checkpoints/step_* | sort -t_ -k2 -n | tail -1)
dev-bin/octet-grp lora --device cuda --base "$ck" --compare-bf16 --backward quantized --steps 200 \
  --sample-tokens 0 --no-save --out-dir /tmp/runs --name lc > $R/lora-compare.txt 2>&1
echo "lora compare rc=$? ($((SECONDS-t0)) s)"; tail -7 $R/lora-compare.txt | head -4
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
