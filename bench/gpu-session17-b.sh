#!/usr/bin/env bash
# Seventeenth session ($OUT set; carry dev-bin): is the ~1B LoRA step's
# backward paced by the host's launches? `OCTET_HOST_TIMING=1` prints the
# host's time to enqueue the backward and the device's time to finish it
# (a synchronization added after the backward), FP8 base and bf16 base.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  OCTET_HOST_TIMING=1 run1b dev-bin/octet lora h-$1-$2 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
  grep "host timing" /tmp/run1b.txt
done
echo "done ($((SECONDS-t0)) s)"
