#!/usr/bin/env bash
# Twenty-fourth session, seventh call ($OUT set; carry dev-bin): where the
# small-M kernel should hand over to the wgmma kernel. `OCTET_MIXED_SMALL_MAX=N`
# (a switch of this call only) sends M > N to the large-M path. Mixed selftest
# cases at 16 and 64, then `octet bench mixed` at M = 16-64 on the issue's
# three weights and the ~1B shapes, limits 64 and 16 in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
mixed_configs OCTET_MIXED_SMALL_MAX "64 16" 2 copy --m 16,24,32,40,48,64 \
  --kn 4096x4096,4096x14336,8192x28672,2048x2048,2048x5632,5632x2048
# The single-launch rows (M > limit has no back-to-back rows): ms.
for c in 64 16; do
  for rep in 1 2; do
    echo "limit $c rep $rep ms: $(grep -E '^mixed fp8 e4m3 per-channel K=[0-9]+ N=[0-9]+ M=[0-9]+ ' $R/mixed-$c-$rep.txt | sed 's/   */ /g' | awk '{print $5 $6, $7, $8}' | sed 's/K=//;s/N=/x/;s/M=//' | paste -sd' ')"
  done
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
# The limit stayed at 64 (BENCHMARKS.md); the switch was removed after this call.
