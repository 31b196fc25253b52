#!/usr/bin/env bash
# (Dropped after this call: the heuristic's first algorithm was as fast; see BENCHMARKS.md, seventeenth session.)
# Seventeenth session ($OUT set; carry dev-bin): does timing cuBLASLt's other
# heuristic algorithms pay? `OCTET_GEMM_TUNE=1` times the heuristic's first 8
# algorithms at each plan's first call and keeps the fastest. ~1B LoRA step
# (FP8 base, quantized, FP8 saved; bf16 base) and ~1B training at batch 16
# (bf16, tensorwise), each with and without. (A first call failed in the
# tuned runs: the timing events were made without timing; fixed.)
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
for tune in 0 1; do
  if [ $tune = 1 ]; then export OCTET_GEMM_TUNE=1; else unset OCTET_GEMM_TUNE; fi
  echo "== OCTET_GEMM_TUNE=$tune"
  for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
    set -- $cfg
    run1b dev-bin/octet lora l-$1-$2 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
  done
  echo "($((SECONDS-t0)) s)"
done
for tune in 0 1; do
  if [ $tune = 1 ]; then export OCTET_GEMM_TUNE=1; else unset OCTET_GEMM_TUNE; fi
  echo "== OCTET_GEMM_TUNE=$tune"
  for r in bf16 tensorwise; do
    run1b dev-bin/octet train t-$r 16 10 4 --recipe $r
  done
  echo "($((SECONDS-t0)) s)"
done
echo "done ($((SECONDS-t0)) s)"
