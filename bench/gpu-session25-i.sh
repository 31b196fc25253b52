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
# (Rewritten after the run to call `large_m_old_vs_new`: the same runs in the same order.)
large_m_old_vs_new
echo "done ($((SECONDS-t0)) s)"
# Result: level (8192x28672 M = 2048 block128 0.87 / 0.90x against HEAD's 0.91 / 0.91x in the same call; per channel 0.98-1.01 against 0.99); full selftest 482 of 482 with it. Reverted.
