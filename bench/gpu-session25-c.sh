#!/usr/bin/env bash
# Twenty-fifth session, third call ($OUT set; carry dev-bin: octet = the
# small-M kernel with lean copies (per-lane addresses fixed outside the loop,
# immediate offsets, K guards only in a partial last block); octet-old =
# 9fc6b5c's kernel): the weight-only selftest cases of both, then `octet bench
# mixed` at M = 1, 4, 8, 12, 16 on the issue's three weights, old and new in
# turn, twice; then decode on the ~1B model, in turn, twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
# (Rewritten after the run to call `old_vs_new`: the same runs in the same order.)
old_vs_new "octet-old octet" --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672
echo "done ($((SECONDS-t0)) s)"
# Result: slower at every M (M = 16 0.28-0.38 of copy): each quarter-warp's 16-byte copies landed in one bank group (16 rows of 128 bytes at the same column). Not kept.
