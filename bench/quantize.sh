#!/usr/bin/env bash
# The FP8 quantize kernels on the GPU against a device-to-device copy: per
# tensor (current scaling, two passes), given scale (delayed, one pass),
# 1x128 blocks, E5M2, f32 input, on a 16384x8192 tensor, row-wise + column-wise
# copies; then bench/peers/quantize.py: the same tensorwise quantize written in
# PyTorch, eager and under torch.compile.
#
#   OCTET=target/release/octet bash bench/quantize.sh OUT_DIR
#
# Runs: octet bench quantize --device cuda --json OUT_DIR/quantize.json
# Writes quantize.json, peers-quantize.json and their logs into OUT_DIR.
# Needs one GPU; PyTorch for the peer. About 30 s on an H100.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

step quantize "$OCTET" bench quantize --device cuda --json "$OUT/quantize.json"
step peers-quantize "$PYTHON" "$PEERS/quantize.py" "$OUT/peers-quantize.json"

summarize() { summarize_py quantize "$OUT/quantize.json" "$OUT/peers-quantize.json"; }
bench_finish summarize
