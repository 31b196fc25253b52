#!/usr/bin/env bash
# Twenty-first session, sixth call ($OUT set; carry dev-bin): the fused LoRA
# cast kernels with B^T rows loaded just in time for ranks above 16
# (dev-bin/octet-jit) against ahead (dev-bin/octet, 76ae9a1): the same sums,
# so the same losses.
# - `octet selftest --device cuda` on octet-jit;
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven): FP8 base old / jit
#   alternated twice, bf16 base between;
# - ncu's time of the lora_cast kernels of a 2-step run, both binaries.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
run_selftest dev-bin/octet-jit $R/selftest.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora l-fp8-old-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet-jit lora l-fp8-jit-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
echo "lora ($((SECONDS-t0)) s)"
for b in octet octet-jit; do
  timeout 120 /usr/local/cuda/bin/ncu --kernel-name regex:lora_cast --metrics gpu__time_duration.sum --csv \
    dev-bin/$b lora --device cuda --model 1b --batch 4 --seq 2048 --steps 2 --eval-batches 0 --sample-tokens 0 \
    --no-save $fp8 --out-dir /tmp/runs --name n-$b > $R/ncu-cast-$b.csv 2> $R/ncu-cast-$b.err
  echo "== ncu $b ($((SECONDS-t0)) s)"
  python3 - $R/ncu-cast-$b.csv <<'PY'
import csv, sys, collections
rows = [l for l in open(sys.argv[1]) if l.startswith('"')]
t = collections.defaultdict(float); n = collections.Counter()
for r in csv.DictReader(rows):
    if r["Metric Name"] == "gpu__time_duration.sum":
        t[r["Kernel Name"]] += float(r["Metric Value"].replace(",", "")) / 1e3; n[r["Kernel Name"]] += 1
for k in sorted(t): print(f"  {k:28s} x{n[k]:4d} {t[k] / 2:9.1f} us a step")
PY
done
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
