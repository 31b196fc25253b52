#!/usr/bin/env bash
# Seventeenth session, first H100 call ($OUT set; carry dev-bin): new binary
# (block-scaled upcast without the bf16 round trip; `bench mixed` times the
# M = 2048 products round robin) against the session's starting one
# (dev-bin/octet-old, 6a24a61).
# - selftest of the new binary;
# - bench mixed at M = 2048: new, old, new;
# - the ~1B LoRA step, FP8 base (fp8, quantized, FP8 saved) and bf16 base;
# - ncu's time of every kernel of a 2-step LoRA run for both (the table covers step 1).
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
timeout 200 dev-bin/octet selftest --device cuda > /tmp/r/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass|^error" /tmp/r/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -8
for b in octet octet-old octet; do
  timeout 120 dev-bin/$b bench mixed --device cuda --m 2048 > /tmp/r/mixed-$b.txt 2>&1
  echo "== $b bench mixed M=2048 rc=$? ($((SECONDS-t0)) s)"
  grep -E "M=2048" /tmp/r/mixed-$b.txt | sed 's/  */ /g'
  cat /tmp/r/mixed-$b.txt >> /tmp/r/mixed-all.txt
done
. bench/session12_runs.sh
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  run1b dev-bin/octet lora l-$1-$2 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
done
echo "($((SECONDS-t0)) s)"
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  timeout 150 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    dev-bin/octet lora --device cuda --model 1b --batch 4 --seq 2048 --steps 2 --eval-batches 0 --sample-tokens 0 \
    --no-save --base-format $1 --compute $2 --backward $3 --saved-activations $4 --out-dir /tmp/runs --name n-$1 \
    > /tmp/r/ncu-lora-$1.csv 2> /tmp/r/ncu-lora-$1.err
  echo "== ncu lora $1 ($((SECONDS-t0)) s)"
  python3 bench/kernel_table.py octet /tmp/r/ncu-lora-$1.csv | head -45
  gzip -f /tmp/r/ncu-lora-$1.csv
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
