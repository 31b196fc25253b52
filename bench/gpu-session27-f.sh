#!/usr/bin/env bash
# Twenty-seventh session, call f ($OUT set; carry dev-bin: octet = HEAD plus
# the spread rule): a small-M launch of few blocks asks each block for enough
# shared memory that an SM takes at most ceil(blocks / SMs) of them (call e:
# 4096x4096 at 5-8 tokens read 0.81-0.83 of copy with two blocks an SM,
# against 0.74 for 1-4 tokens with room for four). OCTET_MIXED_SPREAD=0 is
# the committed behaviour.
# 1. the weight-only selftest cases;
# 2. `bench mixed` M = 1,4,8,12,16 on the issue's three weights, spread off
#    and on in turn, two rounds;
# 3. decode on the ~1B model, off and on, two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-mixed.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-mixed.txt)" | tee $R/summary.txt
for rep in 1 2; do
  for sp in 0 1; do
    OCTET_MIXED_SPREAD=$sp dev-bin/octet bench mixed --device cuda --m 1,4,8,12,16 \
      --kn 4096x4096,4096x14336,8192x28672 > $T/mixed-$sp.txt 2>&1
    echo "== spread=$sp rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/mixed-$sp.txt copy)"
  done
done | tee -a $R/summary.txt
cp $T/mixed-1.txt $R/mixed-spread-2.txt
for rep in 1 2; do
  for sp in 0 1; do
    OCTET_MIXED_SPREAD=$sp dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 \
      --max-tokens 256 --temperature 0 > $T/generate.txt 2>&1
    echo "generate spread=$sp rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
