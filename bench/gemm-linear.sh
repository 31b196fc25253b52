#!/usr/bin/env bash
# GEMMs and one Linear layer on the GPU, octet against PyTorch and torchao:
# - octet bench gemm: the whole GPU suite (1 GiB copy floor, the quantize
#   kernels, cuBLASLt bf16 and FP8 GEMMs at six shapes, Linear forward +
#   backward per recipe at four shapes);
# - octet bench linear: Linear forward + backward per recipe at
#   16384x4096x14336, 8192x8192x8192, 4096x4096x4096, 2048x4096x4096;
# - bench/peers/linear.py at the same four shapes: PyTorch bf16 nn.Linear
#   eager and compiled, torchao float8 tensorwise compiled (skipped without torchao).
#
#   OCTET=target/release/octet bash bench/gemm-linear.sh OUT_DIR
#
# Writes gemm.json, linear.json, peers-linear.json and their logs into OUT_DIR.
# Needs one GPU; PyTorch (and torchao) for the peers. About a minute on an H100.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

step gemm "$OCTET" bench gemm --device cuda --json "$OUT/gemm.json"
step linear "$OCTET" bench linear --device cuda --json "$OUT/linear.json"
step peers-linear "$PYTHON" "$PEERS/linear.py" "$OUT/peers-linear.json"

summarize() {
  summarize_py gemm "$OUT/gemm.json"
  summarize_py linear "$OUT/linear.json" "$OUT/peers-linear.json"
}
bench_finish summarize
