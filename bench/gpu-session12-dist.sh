#!/usr/bin/env bash
# Twelfth session, 2 x H200: sharded data parallel on the ~1B model with the
# session's kernels (wgmma/TMA attention, FP8 saved activations, bf16 input
# gradients), at per-GPU batches 8 and 16 x 2048: bf16 FSDP against tensorwise
# with FP8 gathers (quantized backward; full and FP8 saved activations), and
# the single-GPU runs at the same per-GPU batch for the scaling. 8 steps; tokens/s
# over steps 3-8 (whole job), peak device memory of rank 0.
# Run on the lent GPUs with $OUT set (carry dev-bin): bash bench/gpu-session12-dist.sh
set -uo pipefail
export NCCL_NVLS_ENABLE=0
bin=dev-bin/octet
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$SECONDS
big="--device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/big"
run() { # name tokens-per-step args...
  local name=$1 tok=$2; shift 2
  $bin train $big --name $name "$@" > $OUT/$name.txt 2>&1 || { echo "$name failed"; tail -3 $OUT/$name.txt; return; }
  echo "-- $name: $*"
  python3 bench/metrics_summary.py /tmp/big/$name/metrics.jsonl $tok 3
}
for pb in 8 16; do
  run one-bf16-b$pb $((pb * 2048)) --recipe bf16 --batch $pb
  run one-tw-b$pb $((pb * 2048)) --recipe tensorwise --backward quantized --saved-activations fp8 --batch $pb
  run two-bf16-b$pb $((2 * pb * 2048)) --recipe bf16 --batch $((2 * pb)) --nproc 2
  run two-tw-full-b$pb $((2 * pb * 2048)) --recipe tensorwise --backward quantized --batch $((2 * pb)) --nproc 2
  run two-tw-fp8-b$pb $((2 * pb * 2048)) --recipe tensorwise --backward quantized --saved-activations fp8 --batch $((2 * pb)) --nproc 2
  echo "($((SECONDS-t0)) s)"
done
grep -ihE "all-gather|gathered|reduce-scatter" $OUT/two-bf16-b8.txt $OUT/two-tw-full-b8.txt | head -6
echo "total $((SECONDS-t0)) s"
