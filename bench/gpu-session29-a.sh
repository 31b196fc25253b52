#!/usr/bin/env bash
# Twenty-ninth session, call a ($OUT set; carry dev-bin: octet = 42f8c88, the
# review commit: the small-M product launched through launch::Dep, the same
# cuLaunchKernelEx config the decode kernels use). Checks it on the GPU:
# 1. the full selftest; 2. the small-M table; 3. decode once.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
grep -a "FAIL" $R/selftest.txt | head | tee -a $R/summary.txt
dev-bin/octet bench mixed --device cuda --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672 \
  > $R/mixed-small.txt 2>&1
echo "small rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $R/mixed-small.txt copy)" | tee -a $R/summary.txt
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
  --temperature 0 > $R/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)" | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
