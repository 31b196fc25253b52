#!/usr/bin/env bash
# Eighteenth session ($OUT set; carry dev-bin): `lora_cast_du` with the next
# chunk's B^T loads in flight (call b's version waited for them). selftest,
# ncu's time of the fused kernel and of the kernels it replaces (old binary:
# the E5M2 cast and the du GEMM) over a 2-step ~1B LoRA run, then the step,
# old and new binary alternated, and the bf16 base.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$?"; grep -E "cases pass|FAIL" $R/selftest.txt | head -5
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
for bin in octet-old octet; do
  timeout 200 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum,dram__bytes.sum --csv \
    --kernel-name regex:"lora_cast_du|cast_transpose_bf16_e5m2|transpose_b16|nvjet_sm90_tst_64x32_64x16_2x1_v_bz_TTT" \
    dev-bin/$bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 2 --eval-batches 0 --sample-tokens 0 \
    --no-save $fp8 --out-dir /tmp/runs --name n-$bin > $R/ncu-$bin.csv 2> $R/ncu-$bin.err
  echo "== ncu $bin ($((SECONDS-t0)) s)"
  python3 - $R/ncu-$bin.csv <<'PY'
import csv, sys, collections
lines = [l for l in open(sys.argv[1]) if l.startswith('"')]
t = collections.defaultdict(float); b = collections.defaultdict(float); n = collections.Counter()
for r in csv.DictReader(lines):
    k = r["Kernel Name"][:48]; v = float(r["Metric Value"].replace(",", ""))
    if r["Metric Name"] == "gpu__time_duration.sum": t[k] += v; n[k] += 1
    else: b[k] += v
for k in sorted(t, key=lambda k: -t[k]):
    # two steps captured: per step = half
    print(f"{k:50s} x{n[k]//2:4d} {t[k]/2e6:8.3f} ms/step, DRAM {b[k]/t[k]:.0f} GB/s")
PY
done
for rep in 1 2; do
  for bin in octet-old octet; do
    run1b dev-bin/$bin lora l-$bin-$rep 4 8 3 $fp8 | tee -a $R/steps.txt
  done
done
run1b dev-bin/octet lora l-bf16 4 8 3 --base-format bf16 --compute bf16 --backward high_precision | tee -a $R/steps.txt
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
