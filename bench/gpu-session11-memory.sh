#!/usr/bin/env bash
# Peak memory with FP8 saved activations, eleventh session: the ~1B LoRA step
# (8 steps) and the ~1B training step at batch 8 and 16 x 2048 (4 steps), full
# vs FP8 saved activations. Peak device = driver's used memory (pool included);
# peak allocated = the memory pool's high-water mark.
# Run on the lent GPU with $OUT set: bash bench/gpu-session11-memory.sh [lora|train|all]
# Settings (environment): LORA_CFGS ("base compute backward saved", comma-separated),
# TRAIN_CFGS ("recipe backward saved", comma-separated), BATCHES, TRAIN_STEPS.
set -uo pipefail
bin=dev-bin/octet
what="${1:-all}"
lora_cfgs="${LORA_CFGS:-fp8-tensorwise fp8 dequantized fp8,fp8-tensorwise fp8 quantized fp8,fp8-tensorwise fp8 dequantized full,bf16 bf16 high_precision full}"
train_cfgs="${TRAIN_CFGS:-bf16 high_precision full,tensorwise quantized fp8,tensorwise dequantized fp8}"
summary() { python3 bench/metrics_summary.py "$1" "$2" 3; }
if [ "$what" = lora ] || [ "$what" = all ]; then
  IFS=, read -ra cfgs <<< "$lora_cfgs"
  for cfg in "${cfgs[@]}"; do
    set -- $cfg
    echo "-- lora 1b: base $1, compute $2, backward $3, saved activations $4"
    $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --saved-activations $4 --out-dir /tmp/runs --name l-$1-$3-$4 > /tmp/l.txt 2>&1 || tail -5 /tmp/l.txt
    summary /tmp/runs/l-$1-$3-$4/metrics.jsonl 8192
  done
fi
if [ "$what" = train ] || [ "$what" = all ]; then
  IFS=, read -ra cfgs <<< "$train_cfgs"
  for bs in ${BATCHES:-8 16}; do
    for cfg in "${cfgs[@]}"; do
      set -- $cfg
      echo "-- train 1b: recipe $1, backward $2, saved activations $3, batch $bs x 2048"
      $bin train --device cuda --model 1b --batch $bs --seq 2048 --steps ${TRAIN_STEPS:-4} --eval-batches 0 --sample-tokens 0 --no-save \
        --recipe $1 --backward $2 --saved-activations $3 --out-dir /tmp/runs --name t-$1-$2-$3-$bs > /tmp/t.txt 2>&1 || tail -5 /tmp/t.txt
      summary /tmp/runs/t-$1-$2-$3-$bs/metrics.jsonl $((bs * 2048))
    done
  done
fi
