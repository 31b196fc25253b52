#!/usr/bin/env bash
# The CPU reference backend's figures (no GPU needed):
# - octet bench quantize / gemm / linear --device cpu: FP8 conversions of 64 MiB
#   of f32, the full reference quantize of every recipe, emulated FP8 GEMMs
#   against f32 sgemm, one Linear layer's forward + backward per recipe;
# - octet bench mixed --device cpu: weight-only FP8 products (the SIMD kernels)
#   against bf16 and f32 weights, M = 1, 4, 16 on 4096x4096, 4096x14336, 8192x28672;
# - octet generate --random-model 1b --device cpu: decoding the ~1B model with
#   FP8 weights against bf16, 64 new tokens.
#
#   OCTET=target/release/octet bash bench/cpu.sh OUT_DIR
#
# Threads: all of the machine's (RAYON_NUM_THREADS limits them). REPS (default
# 5 for quantize/gemm/linear, 9 for mixed) sets --reps. Not part of all.sh.
# Writes cpu-*.json, generate-cpu.log and the other logs into OUT_DIR. About
# 2-4 minutes on 2 cores, less on more.
BENCH_ON="CPU: $( (lscpu 2>/dev/null | sed -n 's/^Model name: *//p'; sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null) | head -1), $(nproc 2>/dev/null) threads"
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

for op in quantize gemm linear; do
  step "cpu-$op" "$OCTET" bench "$op" --device cpu --reps "${REPS:-5}" --json "$OUT/cpu-$op.json"
done
step cpu-mixed "$OCTET" bench mixed --device cpu --reps "${REPS:-9}" --m 1,4,16 \
  --kn 4096x4096,4096x14336,8192x28672 --json "$OUT/cpu-mixed.json"
step generate-cpu "$OCTET" generate --random-model 1b --device cpu --weights fp8 --compare bf16 \
  --max-tokens 64 --temperature 0

summarize() {
  summarize_py table "$OUT/cpu-quantize.json" "$OUT/cpu-gemm.json" "$OUT/cpu-linear.json" "$OUT/cpu-mixed.json"
  summarize_py generate "$OUT/generate-cpu.log"
}
bench_finish summarize
