#!/usr/bin/env bash
# Twenty-fifth session, fourth call ($OUT set; carry dev-bin: octet = the
# small-M kernel with lean copies (per-lane cursors kept in registers,
# coalesced rows, guards only in a partial last block or row tile); octet-old =
# 9fc6b5c's kernel): the weight-only selftest cases of the new one, then `octet bench
# mixed` at M = 1, 4, 8, 12, 16 on the issue's three weights, old and new in
# turn, twice; then decode on the ~1B model, in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
# (Rewritten after the run to call `old_vs_new`: the same runs in the same order.)
old_vs_new "octet" --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
# Result: mixed (4096x4096 M = 4-8 +0.02-0.05, 4096x14336 M = 1 +0.03; 4096x14336 M = 8 -0.03, M = 12 -0.08; M = 16 level; decode level): fewer instructions did not move M = 16. Reverted.
