#!/usr/bin/env bash
# Sharded data parallel (FSDP-style, one process a GPU over NCCL) on the ~1B
# Llama: one GPU unsharded against NPROC GPUs at the same per-GPU batch
# (8 x 2048 tokens), bf16 and FP8 tensorwise (FP8 all-gathers of the block
# weights). Prints tokens/s of the whole job, the scaling over one GPU, FP8
# against bf16, rank 0's peak memory and the NCCL bytes a step.
#
#   OCTET=target/release/octet bash bench/multi-gpu.sh OUT_DIR
#
# NPROC (default 2): GPUs of the sharded runs; PER_GPU_BATCH (default 8);
# STEPS (default 10; steps 4 on are timed). Skips, with a message, on fewer
# than NPROC GPUs. NVLink SHARP (NCCL_NVLS_ENABLE) is off unless the caller
# sets it.
# Writes runs/NAME/metrics.jsonl and the logs into OUT_DIR. About 2 minutes.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

NPROC=${NPROC:-2}
PER_GPU_BATCH=${PER_GPU_BATCH:-8}
STEPS=${STEPS:-10}
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
ngpu=$(gpu_count)
names=one-bf16,one-tensorwise,n$NPROC-bf16,n$NPROC-tensorwise
ran=0
if [ "$NPROC" -lt 2 ] || [ "$ngpu" -lt "$NPROC" ]; then
  skip_step multi-gpu "needs $NPROC GPUs (NPROC, at least 2), found $ngpu"
else
  ran=1
  common=(--device cuda --model 1b --seq 2048 --steps "$STEPS" --eval-batches 0 --sample-tokens 0 --no-save)
  for r in bf16 tensorwise; do
    octet_run "one-$r" train "${common[@]}" --recipe "$r" --batch "$PER_GPU_BATCH"
  done
  for r in bf16 tensorwise; do
    octet_run "n$NPROC-$r" train "${common[@]}" --recipe "$r" --batch $((PER_GPU_BATCH * NPROC)) --nproc "$NPROC"
  done
fi

summarize() {
  if [ "$ran" = 0 ]; then
    echo "  skipped: needs $NPROC GPUs, found $ngpu"
    return
  fi
  echo "  ~1B Llama, $PER_GPU_BATCH x 2048 tokens a GPU; one GPU against $NPROC ranks; steps 4-$STEPS timed;"
  echo "  peak memory of the sharded runs is rank 0's"
  summarize_py runs --dir "$OUT/runs" --names "$names" --first 4 \
    --ratios "n$NPROC-bf16/one-bf16,n$NPROC-tensorwise/one-tensorwise,n$NPROC-tensorwise/n$NPROC-bf16,one-tensorwise/one-bf16"
  local r
  for r in bf16 tensorwise; do
    grep -a "NCCL per step" "$OUT/n$NPROC-$r.log" 2>/dev/null | sed "s/^/  $r: /"
  done
}
bench_finish summarize
