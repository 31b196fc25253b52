#!/usr/bin/env bash
# FP8 saved activations (`--saved-activations fp8`), eleventh session, first call:
# selftest, then the ~1B LoRA step (8 steps) and the training step at batch 4
# (6 steps), full vs FP8 saved activations (bench/gpu-session11-memory.sh runs them).
# Run on the lent GPU with $OUT set: bash bench/gpu-session11-saved.sh [lora|train|all]
set -uo pipefail
if [ "${SKIP_SELFTEST:-}" != 1 ]; then
  dev-bin/octet selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
  grep -E "FAIL|saved activations|all .* cases" $OUT/selftest.txt | cut -c1-420
fi
LORA_CFGS="fp8-tensorwise fp8 dequantized fp8,fp8-tensorwise fp8 dequantized full,bf16 bf16 high_precision full,bf16 bf16 dequantized fp8" \
TRAIN_CFGS="bf16 high_precision full,tensorwise quantized full,tensorwise quantized fp8,tensorwise dequantized fp8" \
BATCHES=4 TRAIN_STEPS=6 bash bench/gpu-session11-memory.sh "${1:-all}"
