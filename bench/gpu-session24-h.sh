#!/usr/bin/env bash
# Twenty-fourth session, eighth call, on 2 x H200 ($OUT set; carry dev-bin):
# HEAD's selftest on the H200, then bench/gpu-session20-x4.sh on both GPUs
# (issue 7: one GPU unsharded, then one rank a GPU, bf16 and tensorwise with
# FP8 gathers, with and without --recompute), a check that the sharded path
# still runs as in the earlier sessions' 2 x H200 figures.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
run_selftest dev-bin/octet $OUT/selftest.txt
bash bench/gpu-session20-x4.sh
