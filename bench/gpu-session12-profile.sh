#!/usr/bin/env bash
# Where the ~1B training step's GPU time goes at batch 16 x 2048, octet against
# its PyTorch peers: ncu's gpu__time_duration of every launch of a 2-step run
# (the table covers step 1, from one embed_fwd to the next), and torch.profiler
# over one step of torch.compile bf16 and torchao float8 tensorwise. ncu runs
# each kernel alone, so small kernels read slower than inside the step.
# Run on the lent GPU with $OUT set (carry dev-bin and .whl).
set -uo pipefail
bin=dev-bin/octet
bs=${BATCH:-16}
for r in ${RECIPES:-"bf16:high_precision:full" "tensorwise:quantized:fp8"}; do
  IFS=: read -r recipe bwd saved <<< "$r"
  timeout 300 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    $bin train --device cuda --model 1b --batch $bs --seq 2048 --steps 2 --eval-batches 0 --sample-tokens 0 --no-save \
    --recipe $recipe --backward $bwd --saved-activations $saved --out-dir /tmp/runs --name n-$recipe \
    > $OUT/ncu-$recipe-b$bs.csv 2> $OUT/ncu-$recipe-b$bs.err
  echo "== octet $recipe $bwd saved=$saved, batch $bs"
  python3 bench/kernel_table.py octet $OUT/ncu-$recipe-b$bs.csv
  gzip -f $OUT/ncu-$recipe-b$bs.csv
done
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_PROFILE=$OUT PEERS_BATCH=$bs PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_train.py "$OUT/peers-b$bs.json" 5 2>&1 | grep -E "tok/s|not importable|Error"
for f in $OUT/*.kernels.json; do
  echo "== $(basename $f .kernels.json), batch $bs"
  python3 bench/kernel_table.py torch $f
done
