#!/usr/bin/env bash
# Fifteenth session, first H100 call ($OUT set; carry dev-bin): a check of HEAD
# (the session changed the CPU weight-only kernels and host code only):
# - selftest;
# - the ~1B model at batch 16, bf16 and tensorwise, alternated twice;
# - the ~1B LoRA step at batch 4: FP8 base (fp8 compute, quantized, FP8 saved) and bf16 base;
# - `octet bench mixed --device cuda` at M = 1, 4, 16, 2048;
# - `octet generate` on the ~1B random model, FP8 against bf16 weights;
# - the CPU weight-only products on this machine's CPU with 2 threads.
set -uo pipefail
t0=$SECONDS
bin=dev-bin/octet
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
. bench/session12_runs.sh
for r in bf16 tensorwise bf16 tensorwise; do
  run1b $bin train t-$r 16 10 4 --recipe $r
done
echo "($((SECONDS-t0)) s)"
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  run1b $bin lora l-$1-$2 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
done
echo "($((SECONDS-t0)) s)"
timeout 150 $bin bench mixed --device cuda --m 1,4,16,2048 --json $OUT/mixed-cuda.json > $OUT/mixed-cuda.txt 2>&1
echo "bench mixed cuda rc=$? ($((SECONDS-t0)) s)"; grep -E "^ *(4096|8192)" $OUT/mixed-cuda.txt | head -40
timeout 120 $bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $OUT/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s)"; tail -4 $OUT/generate.txt
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-120
RAYON_NUM_THREADS=2 timeout 120 $bin bench mixed --device cpu --reps 9 --kn 4096x14336,8192x28672 --m 1,4 --json $OUT/mixed-cpu2.json > $OUT/mixed-cpu2.txt 2>&1
echo "bench mixed cpu rc=$? ($((SECONDS-t0)) s)"; cat $OUT/mixed-cpu2.txt | head -20
echo "done ($((SECONDS-t0)) s)"
