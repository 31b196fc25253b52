#!/usr/bin/env bash
# Twenty-seventh session, call g ($OUT set; carry dev-bin: octet = the
# spread rule (committed, 706ae4d) plus a 5-slot ring for up to 4 tokens where
# a spread launch's share of an SM's shared memory holds it; OCTET_MIXED_DEEP=0
# is 706ae4d's behaviour).
# 1. the full selftest; the weight-only cases with the deep ring off;
# 2. `bench mixed` M = 1-4 on the issue's three weights, deep off and on in
#    turn, two rounds;
# 3. the issue's table: `bench mixed` M = 1,4,16,64,256,2048;
# 4. decode on the ~1B model, deep off and on, two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
OCTET_MIXED_DEEP=0 OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $T/selftest-deep0.txt 2>&1
echo "selftest mixed deep=0 rc=$? ($((SECONDS-t0)) s): $(selftest_counts $T/selftest-deep0.txt)" | tee -a $R/summary.txt
for rep in 1 2; do
  for d in 0 1; do
    OCTET_MIXED_DEEP=$d dev-bin/octet bench mixed --device cuda --m 1,2,3,4 \
      --kn 4096x4096,4096x14336,8192x28672 > $T/mixed-$d.txt 2>&1
    echo "== deep=$d rep $rep rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $T/mixed-$d.txt copy)"
  done
done | tee -a $R/summary.txt
dev-bin/octet bench mixed --device cuda --m 1,4,16,64,256,2048 --kn 4096x4096,4096x14336,8192x28672 \
  --json $R/mixed-table.json > $R/mixed-table.txt 2>&1
echo "table rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $R/mixed-table.txt copy)" | tee -a $R/summary.txt
for rep in 1 2; do
  for d in 0 1; do
    OCTET_MIXED_DEEP=$d dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 \
      --max-tokens 256 --temperature 0 > $T/generate.txt 2>&1
    echo "generate deep=$d rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
