#!/usr/bin/env bash
# Twenty-eighth session, call d ($OUT set; carry dev-bin: octet-old = 4713ec3
# (fused decode glue), octet = attention split along the sequence: a (heads,
# runs) grid, four positions a warp in flight, the last run of a head
# combining the runs in order). Call c's ncu: attention 35 us a layer at 260
# positions with 16 blocks, 580 of 1391 us a step.
# 1. the full selftest;
# 2. decode old / new, 256 tokens, FP8 and bf16 weights, two rounds;
# 3. decode old / new, 1800 tokens (long sequences), once;
# 4. ncu over the last steps of a 256-token FP8 run, new.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
grep -a "decode .* model" $R/selftest.txt | sed 's/   */ /g' | tee -a $R/summary.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > $T/generate.txt 2>&1
    echo "generate 256 $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee -a $R/summary.txt
for bin in octet-old octet; do
  dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 1800 \
    --temperature 0 > $T/generate.txt 2>&1
  echo "generate 1800 $bin rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
done | tee -a $R/summary.txt
ncu --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
  --launch-skip 37300 --launch-count 1200 \
  dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --max-tokens 256 --temperature 0 \
  > $T/ncu.csv 2> $T/ncu.err
echo "ncu rc=$? ($((SECONDS-t0)) s): $(wc -l < $T/ncu.csv) lines" | tee -a $R/summary.txt
python3 - $T/ncu.csv >> $R/summary.txt <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "")
    us = {"nsecond": v / 1000, "ns": v / 1000, "usecond": v, "us": v, "msecond": v * 1000, "ms": v * 1000}.get(unit, v)
    rows.append((r["Kernel Name"].split("(")[0], us))
steps = sum(1 for n, _ in rows if n.startswith("embed_row"))
print(f"== {len(rows)} kernels, {steps} steps")
tot = collections.defaultdict(float); cnt = collections.Counter()
for n, us in rows:
    tot[n] += us; cnt[n] += 1
s = sum(tot.values())
for n in sorted(tot, key=lambda n: -tot[n]):
    print(f"{n[:60]:60s} {cnt[n]/max(steps,1):7.1f}/step {tot[n]/max(steps,1):9.1f} us/step {tot[n]/cnt[n]:8.2f} us each")
print(f"{'all kernels':60s} {len(rows)/max(steps,1):7.1f}/step {s/max(steps,1):9.1f} us/step")
PY
echo "done ($((SECONDS-t0)) s)"
