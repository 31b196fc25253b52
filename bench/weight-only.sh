#!/usr/bin/env bash
# Weight-only FP8 products on the GPU (E4M3 weights upcast inside the kernel,
# bf16 activations), beside cuBLASLt's bf16 product of the same shape, which
# `octet bench mixed` times in the same run:
# - decode sizes, M = 1, 2, 4, 8, 12, 16 tokens: each weight back to back in a
#   CUDA graph, as a share of the 1 GiB copy's bandwidth and against cuBLASLt bf16
#   (also row-major codes, f16 activations, L2-resident rows in the JSON);
# - M = 2048: per-channel, per-tensor and 128x128-block factors against cuBLASLt bf16;
# on the weights K x N = 4096x4096, 4096x14336, 8192x28672.
#
#   OCTET=target/release/octet bash bench/weight-only.sh OUT_DIR
#
# Writes mixed-small.json, mixed-2048.json and their logs into OUT_DIR.
# Needs one GPU. About 30 s on an H100.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

kn=4096x4096,4096x14336,8192x28672
step mixed-small "$OCTET" bench mixed --device cuda --m 1,2,4,8,12,16 --kn "$kn" --json "$OUT/mixed-small.json"
step mixed-2048 "$OCTET" bench mixed --device cuda --m 2048 --kn "$kn" --json "$OUT/mixed-2048.json"

summarize() { summarize_py mixed "$OUT/mixed-small.json" "$OUT/mixed-2048.json"; }
bench_finish summarize
