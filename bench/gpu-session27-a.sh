#!/usr/bin/env bash
# Twenty-seventh session, call a ($OUT set; carry dev-bin: octet-old = HEAD
# 92ee738, octet = the change): the small-M weight-only kernel asks L2 for
# the rest of its rows' codes before its griddepcontrol.wait
# (OCTET_MIXED_L2AHEAD, on by default; =0 off), and the decode kernels that
# feed a product (norm, attention, SwiGLU) trigger their dependent at once.
# 1. the weight-only selftest cases, with and without the prefetch;
# 2. `bench mixed` M = 1-16 on the three weights: old, new without, new with,
#    three rounds;
# 3. decode on the ~1B model, the same three, two rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
for a in 1 0; do
  OCTET_MIXED_L2AHEAD=$a OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $T/selftest-$a.txt 2>&1
  echo "selftest l2ahead=$a rc=$? ($((SECONDS-t0)) s): $(selftest_counts $T/selftest-$a.txt)"
done | tee $R/selftest.txt
cp $T/selftest-1.txt $R/selftest-mixed-l2ahead.txt
run() { # NAME: old | new0 | new1, then the command's arguments
  local n=$1; shift
  case $n in
    old) dev-bin/octet-old "$@" ;;
    new0) OCTET_MIXED_L2AHEAD=0 dev-bin/octet "$@" ;;
    new1) dev-bin/octet "$@" ;;
  esac
}
for rep in 1 2 3; do
  for n in old new0 new1; do
    run $n bench mixed --device cuda --m 1,4,8,16 --kn 4096x4096,4096x14336,8192x28672 > $T/mixed-$n-$rep.txt 2>&1
    echo "== $n rep $rep rc=$? ($((SECONDS-t0)) s)"
    mixed_ratios $T/mixed-$n-$rep.txt copy
  done
done | tee $R/mixed.txt
cp $T/mixed-new1-3.txt $R/mixed-new1-3.txt
for rep in 1 2; do
  for n in old new0 new1; do
    run $n generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > $T/generate.txt 2>&1
    echo "generate $n rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee $R/generate.txt
echo "done ($((SECONDS-t0)) s)"
