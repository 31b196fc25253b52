#!/usr/bin/env bash
# Twenty-third session, third call ($OUT set; carry dev-bin: octet = call b's
# new binary (AdamW 64 tensors a launch, gradients added 8 a launch, a
# group's frozen codes transposed in one launch); octet-nt = the same without
# the grouped transposes):
# - ncu (clocks unlocked) durations of one layer's transposes, both binaries;
# - OCTET_PROFILE phase times (synchronizing) of the FP8 step, both
#   binaries, and of the bf16 step;
# - ~1B LoRA step: FP8 both binaries and bf16, three rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
one="lora --device cuda --model 1b --batch 4 --seq 2048 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs"
for b in octet octet-nt; do
  timeout 100 /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:transpose_u8 -c 7 \
    --metrics gpu__time_duration.sum dev-bin/$b $one --steps 1 $fp8 --name n-$b > $R/ncu-$b.txt 2>&1
  echo "== $b"; grep -E "transpose_u8|gpu__time" $R/ncu-$b.txt | sed 's/   */ /g' | grep -v "^ *$" | head -16
done
for v in "octet fp8" "octet-nt fp8" "octet bf16"; do
  set -- $v
  [ $2 = fp8 ] && f=$fp8 || f=$bf16
  OCTET_PROFILE=1 dev-bin/$1 $one --steps 6 $f --name p-$1-$2 > $R/profile-$1-$2.txt 2>&1
  echo "== profile $1 $2"; sed -n '/profile over/,$p' $R/profile-$1-$2.txt | head -14
done
for rep in 1 2 3; do
  run1b dev-bin/octet lora c-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-nt lora c-fp8nt-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora c-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
