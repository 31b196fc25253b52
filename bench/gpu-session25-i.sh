#!/usr/bin/env bash
# Twenty-fifth session, ninth call ($OUT set; carry dev-bin: octet = the
# wgmma kernel with three fragment sets for bf16 output: the next stage
# converts while the groups of the two before run, then waits for the older;
# octet-old = HEAD, two sets): the full selftest of the
# new binary, then `octet bench mixed --m 256,2048` on the issue's three
# weights, old and new in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin bench mixed --device cuda --m 256,2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$bin-$rep.txt 2>&1
    echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "M=(256|2048)" $R/mixed-$bin-$rep.txt | grep -E "^mixed" | sed 's/   */ /g' | awk '{print $4, $5, $6, $7, $(NF-2)}' | paste -sd' '
  done
done
echo "done ($((SECONDS-t0)) s)"
# Result: level (8192x28672 M = 2048 block128 0.87 / 0.90x against HEAD's 0.91 / 0.91x in the same call; per channel 0.98-1.01 against 0.99); full selftest 482 of 482 with it. Reverted.
