#!/usr/bin/env bash
# Twenty-sixth session, call f ($OUT set; carry dev-bin: octet-old = HEAD's
# kernels, octet = mixed_wg reading its block factors from a shared-memory
# table filled at the start instead of a global load a stage ahead): the
# weight-only selftest cases of both (the new binary adds K = 131088, past the
# table), then M = 256 and 2048 on the three weights, the binaries in
# turn, twice (per tensor, per channel and 128x128 blocks).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R $OUT/r
for bin in octet-old octet; do
  OCTET_SELFTEST_ONLY=mixed dev-bin/$bin selftest --device cuda > $R/selftest-$bin.txt 2>&1
  echo "selftest $bin rc=$? ($((SECONDS-t0)) s): $(grep -E 'cases pass|FAIL' $R/selftest-$bin.txt | head -3)"
done 2>&1 | tee $OUT/r/selftest.txt
large_m_old_vs_new 2>&1 | tee $OUT/r/large-m.txt
echo "done ($((SECONDS-t0)) s)"
