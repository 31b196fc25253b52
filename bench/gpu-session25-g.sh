#!/usr/bin/env bash
# Twenty-fifth session, seventh call ($OUT set; carry dev-bin: octet = the
# wgmma kernel issuing each 16-column step as soon as its fragment is upcast
# (the tensor cores start on a stage while the rest of it converts);
# octet-old = f5d81e9, the whole stage upcast first): the full selftest of the
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
# Result: slower (per channel M = 2048 0.79x of cuBLASLt bf16 against 0.95-0.98 on 8192x28672; block128 0.76-0.77 against 0.87-0.90): a wgmma.fence before every step stalls the chain. Full selftest 482 of 482 with it. Reverted.
