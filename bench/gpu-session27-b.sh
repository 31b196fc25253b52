#!/usr/bin/env bash
# Twenty-seventh session, call b ($OUT set; carry dev-bin: octet-old = HEAD
# 92ee738, octet = the change): `mixed_wg` without its per-stage
# __syncthreads (each warp releases a buffer through an `empty` mbarrier once
# its wgmma group on it has completed; thread 0 waits on that barrier before
# refilling the buffer), so the two warpgroups stop running in lockstep.
# 1. the weight-only selftest cases (M > 64 included);
# 2. `bench mixed --m 256,2048` on the three weights, old and new in turn,
#    three rounds, every ratio against cuBLASLt bf16;
# 3. is the small-M kernel's dependent launch doing anything in a graph:
#    `bench mixed --m 1,4,16` with OCTET_MIXED_PDL=0 and 1 in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-mixed.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-mixed.txt)" | tee $R/summary.txt
for rep in 1 2 3; do
  for bin in octet-old octet; do
    dev-bin/$bin bench mixed --device cuda --m 256,2048 --kn 4096x4096,4096x14336,8192x28672 > $T/large-$bin-$rep.txt 2>&1
    echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "^mixed.*M=(256|2048)" $T/large-$bin-$rep.txt | sed 's/   */ /g' | awk '{print $4, $5, $6, $7, $(NF-2)}' | paste -sd' '
  done
done | tee -a $R/summary.txt
cp $T/large-octet-3.txt $R/large-new-3.txt
for rep in 1 2; do
  for p in 0 1; do
    OCTET_MIXED_PDL=$p dev-bin/octet bench mixed --device cuda --m 1,4,16 --kn 4096x4096,4096x14336,8192x28672 > $T/pdl-$p.txt 2>&1
    echo "== pdl=$p rep $rep rc=$? ($((SECONDS-t0)) s)"
    mixed_ratios $T/pdl-$p.txt copy
  done
done | tee -a $R/summary.txt
echo "done ($((SECONDS-t0)) s)"
