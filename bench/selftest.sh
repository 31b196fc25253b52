#!/usr/bin/env bash
# The GPU conformance suite: every CUDA kernel octet ships against the CPU
# reference (bit-exact quantizes, GEMMs, Linear layers, the model's forward
# and backward, weight-only products, decoding, ...).
#
#   OCTET=target/release/octet bash bench/selftest.sh OUT_DIR
#
# Runs: octet selftest --device cuda
# Writes OUT_DIR/selftest.log, machine.txt, steps.tsv, summary.txt.
# Needs one GPU. About a minute on an H100 (a first run on a machine also compiles
# the kernels, up to a minute; later runs read them from the disk cache).
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

step selftest "$OCTET" selftest --device cuda

summarize() { summarize_py selftest "$OUT/selftest.log"; }
bench_finish summarize
