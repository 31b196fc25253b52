#!/usr/bin/env bash
# ~1B LoRA peak device memory, dequantized backward, with either attention kernel set ($OUT unused).
set -uo pipefail
bin=dev-bin/octet
for attn in wgmma mma; do
  for cfg in "fp8-tensorwise fp8 dequantized" "bf16 bf16 dequantized"; do
    set -- $cfg
    OCTET_ATTN=$attn $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 4 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name p-$attn-$1-$2-$3 2>&1 | grep -E "peak device memory" | sed "s/^/[$attn] $1 $2 $3: /"
  done
done
