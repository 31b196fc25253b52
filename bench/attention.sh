#!/usr/bin/env bash
# The training model's causal attention kernels on the GPU, forward and
# backward, at the ~1B model's shape (batch 4, 2048 tokens, 16 heads of 128),
# against PyTorch's scaled_dot_product_attention (flash, cuDNN and
# memory-efficient backends) at the same shape (bench/peers/sdpa.py).
#
#   OCTET=target/release/octet bash bench/attention.sh OUT_DIR
#
# Runs: octet bench attention --device cuda --shapes 4x2048x16x128
# Writes attention.json, peers-sdpa.json and their logs into OUT_DIR.
# Needs one GPU; PyTorch for the peer. Under a minute.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

shape=4x2048x16x128
step attention "$OCTET" bench attention --device cuda --shapes "$shape" --json "$OUT/attention.json"
step peers-sdpa "$PYTHON" "$PEERS/sdpa.py" "$OUT/peers-sdpa.json" --shape "$shape"

summarize() { summarize_py attention "$OUT/attention.json" "$OUT/peers-sdpa.json"; }
bench_finish summarize
