#!/usr/bin/env bash
# Decoding speed of the ~1B Llama (random weights) on one GPU with a KV cache,
# one step replayed as a CUDA graph: block matrices as FP8 (E4M3, per-channel
# factors, the weight-only kernels) against bf16 (cuBLASLt), the same prompt
# and greedy sampling, 256 new tokens.
#
#   OCTET=target/release/octet bash bench/generate-1b.sh OUT_DIR
#
# Runs: octet generate --random-model 1b --device cuda --weights fp8
#       --compare bf16 --max-tokens 256 --temperature 0
# Writes generate.log into OUT_DIR. Needs one GPU. Under a minute.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

step generate "$OCTET" generate --random-model 1b --device cuda --weights fp8 --compare bf16 \
  --max-tokens 256 --temperature 0

summarize() { summarize_py generate "$OUT/generate.log"; }
bench_finish summarize
