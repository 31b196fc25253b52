#!/usr/bin/env bash
# Two builds of octet side by side on one GPU, to check that a change keeps
# the headline figures: Linear forward + backward per recipe (`octet bench
# linear`), ~1B training in bf16 and FP8 tensorwise (tokens/s, peak memory),
# a LoRA ~1B step over an FP8 base, and 1B decoding. The builds alternate
# run by run, so drift of the machine shows in both.
#
#   OCTET_BEFORE=old/octet OCTET=new/octet bash bench/builds.sh OUT_DIR
#
# STEPS (default 8): training steps a run (steps 4-STEPS timed).
# Writes OUT_DIR/{before,after}*-*.{json,log} and runs/; summary.txt lists
# after/before for every figure.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"
: "${OCTET_BEFORE:?set OCTET_BEFORE to the octet binary of the first build}"
AFTER=$OCTET
BEFORE=$(cd "$(dirname "$OCTET_BEFORE")" && pwd)/$(basename "$OCTET_BEFORE")
[ -x "$BEFORE" ] || { echo "error: OCTET_BEFORE=$OCTET_BEFORE is not an executable" >&2; exit 2; }
STEPS=${STEPS:-8}
train=(--device cuda --model 1b --batch 16 --seq 2048 --steps "$STEPS" --eval-batches 0
  --sample-tokens 0 --no-save)
lora=(--device cuda --model 1b --batch 4 --seq 2048 --steps "$STEPS" --eval-batches 0
  --sample-tokens 0 --no-save --base-format fp8-tensorwise --compute fp8 --backward quantized)
# Linear in the order A B B A, each build's figure the mean of its two runs:
# a machine that warms over the runs slows both alike.
for v in before after after-2 before-2; do
  case $v in before*) OCTET=$BEFORE ;; *) OCTET=$AFTER ;; esac
  step $v-linear "$OCTET" bench linear --device cuda --json "$OUT/$v-linear.json"
done
for v in before after; do
  if [ $v = before ]; then OCTET=$BEFORE; else OCTET=$AFTER; fi
  octet_run $v-bf16 train "${train[@]}" --recipe bf16
  octet_run $v-tensorwise train "${train[@]}" --recipe tensorwise
  octet_run $v-lora lora "${lora[@]}"
  step $v-generate "$OCTET" generate --random-model 1b --device cuda --weights fp8 --max-tokens 256 --temperature 0
done

summarize() {
  echo "  Linear forward + backward (octet bench linear, runs A B B A, means), second build against the first:"
  summarize_py builds "$OUT/before-linear.json,$OUT/before-2-linear.json" \
    "$OUT/after-linear.json,$OUT/after-2-linear.json"
  echo "  ~1B training, batch 16 x 2048 (steps 4-$STEPS), and LoRA ~1B over an FP8 base, batch 4 x 2048:"
  summarize_py runs --dir "$OUT/runs" --names before-bf16,after-bf16,before-tensorwise,after-tensorwise,before-lora,after-lora \
    --first 4 --tokens 32768 \
    --ratios "after-bf16/before-bf16,after-tensorwise/before-tensorwise,after-lora/before-lora"
  echo "  1B decoding:"
  summarize_py generate "$OUT/before-generate.log" "$OUT/after-generate.log"
}
bench_finish summarize
