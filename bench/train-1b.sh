#!/usr/bin/env bash
# Training speed and memory of the ~1B Llama (d=2048, 16 layers, 16 heads,
# SwiGLU 5632, byte vocabulary) on one GPU at batch 16 x 2048 tokens:
# - octet bf16 (no FP8), octet FP8 tensorwise with its defaults (quantized
#   backward, FP8 saved activations), and tensorwise keeping its activations
#   whole (--saved-activations full);
# - bench/peers/train.py at the same batch: PyTorch bf16 under torch.compile
#   and torchao float8 tensorwise under torch.compile (skipped without torchao).
# Prints tokens/s over the steps after the first three and the peak memory of each.
#
#   OCTET=target/release/octet bash bench/train-1b.sh OUT_DIR
#
# STEPS (default 10): octet's steps a run; PEER_STEPS (default 10): the peers'
# (the first 3 of each are left out of tokens/s). BATCH (default 16).
# Writes runs/NAME/metrics.jsonl (octet), peers-train.json and the logs into OUT_DIR.
# Needs one GPU with about 55 GB of memory; PyTorch (and torchao) for the peers.
# About 3 minutes on an H100, most of it torch.compile.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

STEPS=${STEPS:-10}
PEER_STEPS=${PEER_STEPS:-10}
BATCH=${BATCH:-16}
common=(--device cuda --model 1b --batch "$BATCH" --seq 2048 --steps "$STEPS"
  --eval-batches 0 --sample-tokens 0 --no-save)
octet_run bf16 train "${common[@]}" --recipe bf16
octet_run tensorwise train "${common[@]}" --recipe tensorwise
octet_run tensorwise-fullsaved train "${common[@]}" --recipe tensorwise --saved-activations full
step peers-train "$PYTHON" "$PEERS/train.py" "$OUT/peers-train.json" \
  --batch "$BATCH" --steps "$PEER_STEPS" --warmup 3 --runs compile,ao

summarize() {
  echo "  ~1B Llama, batch $BATCH x 2048 tokens; octet: steps 4-$STEPS timed; peak device = the driver's used memory;"
  echo "  the peers train on random tokens, octet on its default text: their losses do not compare"
  summarize_py runs --dir "$OUT/runs" --names bf16,tensorwise,tensorwise-fullsaved --first 4 \
    --tokens $((BATCH * 2048)) --peers "$OUT/peers-train.json" \
    --ratios "tensorwise/bf16,tensorwise-fullsaved/bf16,bf16/peer: torch bf16 compile,tensorwise/peer: torchao float8 tensorwise compile"
}
bench_finish summarize
