#!/usr/bin/env bash
# Twenty-seventh session, call d ($OUT set; carry dev-bin: octet-old = HEAD
# 92ee738, octet = the change): split K in the small-M weight-only kernel so
# that a launch of one token group fills its last wave (call c: 16 tokens on
# K = 4096 read 0.86-0.87 of copy at 2.00 waves, 0.80 at 2.06, 0.76-0.77 at 1.50).
# 1. the weight-only selftest cases (with K in 2, 3, 5 runs) under each
#    OCTET_MIXED_SPLITK setting;
# 2. `bench mixed` M = 1-16 on the issue's three weights and 4096x16896 (2.00
#    waves at 16 tokens), splits forced to 1-4 and auto in turn, two rounds;
# 3. decode on the ~1B model, old and new (auto), two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
R=$T mixed_sets OCTET_MIXED_SPLITK "s1=1 s2=2 s3=3 s4=4 auto=auto" 2 copy --m 1,4,8,16 \
  --kn 4096x4096,4096x14336,8192x28672,4096x16896 | tee $R/summary.txt
cp $T/selftest-auto.txt $R/selftest-mixed-auto.txt
cp $T/mixed-auto-2.txt $R/mixed-auto-2.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > $T/generate.txt 2>&1
    echo "generate $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
