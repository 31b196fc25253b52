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
# (Rewritten after the run to call `large_m_old_vs_new`: the same runs in the same order.)
large_m_old_vs_new
echo "done ($((SECONDS-t0)) s)"
# Result: slower (per channel M = 2048 0.79x of cuBLASLt bf16 against 0.95-0.98 on 8192x28672; block128 0.76-0.77 against 0.87-0.90): a wgmma.fence before every step stalls the chain. Full selftest 482 of 482 with it. Reverted.
