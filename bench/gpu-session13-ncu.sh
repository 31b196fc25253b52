#!/usr/bin/env bash
# Thirteenth session: ncu's gpu__time_duration of every kernel of a 2-step ~1B
# run at batch 16 (the table covers step 1), new binary against the session's
# starting one (dev-bin/octet-old), bf16 and tensorwise quantized with FP8
# saved activations: where the fused bf16 + RoPE store of the attention
# backward gains or loses. Run on the lent GPU with $OUT set (carry dev-bin).
set -uo pipefail
t0=$SECONDS
for r in "tensorwise:quantized:fp8" "bf16:high_precision:full"; do
  IFS=: read -r recipe bwd saved <<< "$r"
  for bin in octet octet-old; do
    timeout 250 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
      dev-bin/$bin train --device cuda --model 1b --batch 16 --seq 2048 --steps 2 --eval-batches 0 --sample-tokens 0 \
      --no-save --recipe $recipe --backward $bwd --saved-activations $saved --out-dir /tmp/runs --name n-$recipe \
      > $OUT/ncu-$bin-$recipe.csv 2> $OUT/ncu-$bin-$recipe.err
    echo "== $bin $recipe ($((SECONDS-t0)) s)"
    python3 bench/kernel_table.py octet $OUT/ncu-$bin-$recipe.csv | head -40
    gzip -f $OUT/ncu-$bin-$recipe.csv
  done
done
