#!/usr/bin/env bash
# Twenty-fourth session, tenth call ($OUT set; carry dev-bin): blocks now
# take groups of 8 tokens when built for 8 (the kernel's own group, not 16).
# `OCTET_MIXED_N8_GROUPS=1` (a switch of this call only) sends 9-64 tokens to
# the 8-token shape in groups of 8: each weight tile converted once per group,
# half the x a block. Weight-only selftest cases both ways, then `octet bench
# mixed` at M = 8, 12, 16 on the issue's three weights, both ways in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
mixed_configs OCTET_MIXED_N8_GROUPS "0 1" 2 copy --m 8,12,16,32 --kn 4096x4096,4096x14336,8192x28672
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
# Groups of 8 were slower (BENCHMARKS.md); the switch was removed after this call, the kernel's own groups kept.
