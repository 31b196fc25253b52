#!/usr/bin/env bash
# Twelfth session, one H100 call: the input gradients of projections that read
# one input added in their GEMMs (q+k+v, gate+up) and the 4x4-block byte
# transpose, against the binary before them (dev-bin/octet-old) in the same call:
# - the selftest of the new binary;
# - the transpose alone (`octet bench quantize`, both binaries);
# - the ~1B LoRA step (FP8 base, quantized backward, FP8 saved activations;
#   bf16 base), batch 4 x 2048, 8 steps;
# - the ~1B training step at batch 16 x 2048 (bf16; tensorwise quantized with
#   FP8 saved activations), 10 steps.
# Run on the lent GPU with $OUT set (carry dev-bin): bash bench/gpu-session12-h100.sh
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
old=dev-bin/octet-old
$new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|transpose_u8|cases pass|of .* pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
for b in new old; do
  bin=dev-bin/octet; [ $b = old ] && bin=$old
  for t in 2048x5632 8192x28672; do
    echo "-- $b: bench quantize --tensor $t"
    $bin bench quantize --device cuda --tensor $t 2>&1 | grep -E "copy d2d|transpose_u8" | sed 's/  */ /g'
  done
done
. bench/session12_runs.sh
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  for bin in $new $old; do
    run1b $bin lora l-$(basename $bin)-$1-$3 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
  done
done
echo "lora done ($((SECONDS-t0)) s)"
for cfg in "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  for bin in $new $old; do
    run1b $bin train t-$(basename $bin)-$1-$2 16 10 4 --recipe $1 --backward $2 --saved-activations $3
  done
done
echo "done ($((SECONDS-t0)) s)"
