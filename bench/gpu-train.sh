#!/usr/bin/env bash
# The GPU training checks and measurements, run on the lent GPU machine with a
# binary built on the CPU machine: `dev-bin/octet` (see BENCHMARKS.md).
#   bench/gpu-train.sh OUT_DIR [quick|nopeers]
set -uo pipefail
out="${1:?output directory}"
bin=dev-bin/octet
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
$bin selftest --device cuda > "$out/selftest.txt" 2>&1
echo "selftest rc=$?"; grep -E "FAIL|attention|Llama|AdamW|all .* cases" "$out/selftest.txt" | head -40
# The README's default run on the GPU (small model, 300 steps), for the curve against the CPU run.
$bin train --device cuda --out-dir /tmp/runs --name gpu-small > "$out/train-small.txt" 2>&1
echo "small rc=$?"; tail -14 "$out/train-small.txt"
[ "${2:-}" = quick ] && exit 0
# ~1B Llama (d=2048, 16 layers, 16 heads, MLP 5632), batch 4 x 2048 tokens.
for r in bf16 tensorwise; do
  $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-every 0 \
    --sample-tokens 0 --recipe $r --out-dir /tmp/runs --name 1b-$r > "$out/train-1b-$r.txt" 2>&1
  echo "1b $r rc=$?"; tail -6 "$out/train-1b-$r.txt"
  cp /tmp/runs/1b-$r/metrics.jsonl "$out/metrics-1b-$r.jsonl" 2>/dev/null
done
[ "${2:-}" = nopeers ] && exit 0
# PyTorch peers of the 1B run (bf16 eager / compiled, torchao float8 if carried in .whl).
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
PYTHONUNBUFFERED=1 python3 bench/peers_train.py "$out/peers-train-1b.json" 10 2>&1 | grep -v Warning | tail -8
