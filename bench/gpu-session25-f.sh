#!/usr/bin/env bash
# Twenty-fifth session, sixth call ($OUT set; carry dev-bin: octet = the
# small-M kernel whose code copies carry the .L2::256B prefetch hint
# octet-old = 4a6fdd4, without it): the weight-only selftest cases of the new one, then `octet bench
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
# Result: level within 0.02 at every M; decode 744-795 against 722-745 tok/s (one pair each, noisy). Not kept.
