#!/usr/bin/env bash
# Twenty-sixth session, call b ($OUT set; carry dev-bin): the integer E4M3
# conversion without its NaN fix in the weight-only kernels (four
# instructions a pair, as in hardware), and the selftest's skip of FP8-GEMM
# cases on a GPU without them.
# 1. the full selftest as an Ampere GPU runs it (OCTET_FP8_CONVERT=soft,
#    OCTET_FP8_GEMM=off), and with the integer conversions alone;
# 2. the weight-only cases and `bench mixed` (M = 1-16) with hardware and
#    integer conversions in turn, two rounds;
# 3. decode on the ~1B model both ways, two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off dev-bin/octet selftest --device cuda > $R/selftest-ampere.txt 2>&1
echo "selftest ampere rc=$? ($((SECONDS-t0)) s)"; grep -E "cases pass|FAIL|skipped" $R/selftest-ampere.txt | head -8
OCTET_FP8_CONVERT=soft dev-bin/octet selftest --device cuda > $R/selftest-soft.txt 2>&1
echo "selftest soft rc=$? ($((SECONDS-t0)) s)"; grep -E "cases pass|FAIL|skipped" $R/selftest-soft.txt | head -8
R=/tmp/r; mkdir -p $R
mixed_configs OCTET_FP8_CONVERT "auto soft" 2 copy --m 1,4,8,16 --kn 4096x4096,4096x14336,8192x28672 > $OUT/r/mixed.txt 2>&1
cat $OUT/r/mixed.txt
for rep in 1 2; do
  for c in auto soft; do
    OCTET_FP8_CONVERT=$c OCTET_FP8_GEMM=$([ $c = soft ] && echo off || echo auto) dev-bin/octet generate --random-model 1b \
      --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate.txt 2>&1
    echo "generate $c rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)"
  done
done | tee $OUT/r/generate.txt
echo "done ($((SECONDS-t0)) s)"
