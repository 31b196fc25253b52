#!/usr/bin/env bash
# Twenty-sixth session, call d ($OUT set; carry dev-bin): the probe at open
# where FP8 is converted in integer code. `octet info` opens the GPU; each
# setting twice (the second run has the kernels cached), then the weight-only
# selftest cases both ways and decode with integer conversions.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
for c in auto soft auto soft; do
  s=$(date +%s%N); OCTET_FP8_CONVERT=$c dev-bin/octet info > $R/info-$c.txt 2>&1; rc=$?
  echo "info $c rc=$rc $(( ($(date +%s%N) - s) / 1000000 )) ms: $(grep -i "FP8 conversions" $R/info-$c.txt | grep -o "FP8 conversions[^,]*")"
done
OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-ampere.txt 2>&1
echo "selftest ampere rc=$? ($((SECONDS-t0)) s): $(grep -E 'cases pass|FAIL' $R/selftest-ampere.txt | head -3)"
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-hw.txt 2>&1
echo "selftest hw rc=$? ($((SECONDS-t0)) s): $(grep -E 'cases pass|FAIL' $R/selftest-hw.txt | head -3)"
OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off dev-bin/octet generate --random-model 1b --device cuda --weights fp8 \
  --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-soft.txt 2>&1
echo "generate soft rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-soft.txt)"
echo "done ($((SECONDS-t0)) s)"
# (The call's first version timed with `bc`, which the machine lacks; the times
# came from a second command on the same machine, python's time.time() around
# `octet info`: auto 0.681 / 0.630 s, soft 0.621 / 0.590 s.)
