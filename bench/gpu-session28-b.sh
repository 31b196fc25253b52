#!/usr/bin/env bash
# Twenty-eighth session, call b ($OUT set; carry dev-bin: octet = HEAD).
# Where a decode step of the ~1B model goes: at ~720 tok/s a step takes
# ~1.39 ms, while its 823 MB of FP8 matrices (and the 131 MB bf16 head) read at
# copy speed would take ~0.33 ms.
# 1. decode tok/s, FP8 and bf16 weights (reference, same binary);
# 2. ncu: every kernel's duration over a short FP8 run (graph nodes profiled
#    one by one), summed by kernel name and divided by the steps;
# 3. the same with bf16 weights.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
  --temperature 0 > $R/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)" | tee $R/summary.txt
NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)
echo "ncu: $NCU" | tee -a $R/summary.txt
for wts in fp8 bf16; do
  $NCU --clock-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
    dev-bin/octet generate --random-model 1b --device cuda --weights $wts --max-tokens 8 --temperature 0 \
    > $T/ncu-$wts.csv 2> $T/ncu-$wts.err
  echo "ncu $wts rc=$? ($((SECONDS-t0)) s): $(wc -l < $T/ncu-$wts.csv) lines" | tee -a $R/summary.txt
  tail -3 $T/ncu-$wts.err >> $R/summary.txt
  python3 - $T/ncu-$wts.csv $wts >> $R/summary.txt <<'PY'
import csv, sys, collections
rows = []
with open(sys.argv[1]) as f:
    lines = [l for l in f if l.startswith('"')]
for r in csv.DictReader(lines):
    if r.get("Metric Name") != "gpu__time_duration.sum":
        continue
    v = float(r["Metric Value"].replace(",", ""))
    unit = r.get("Metric Unit", "")
    us = v / 1000 if unit == "nsecond" else v * 1000 if unit == "msecond" else v
    rows.append((r["Kernel Name"].split("(")[0], us))
# steps: the embed kernel runs once per step
steps = sum(1 for n, _ in rows if n.startswith("embed_row"))
print(f"== {sys.argv[2]}: {len(rows)} kernels, {steps} steps")
tot = collections.defaultdict(float); cnt = collections.Counter()
for n, us in rows:
    tot[n] += us; cnt[n] += 1
s = sum(tot.values())
for n in sorted(tot, key=lambda n: -tot[n]):
    print(f"{n[:60]:60s} {cnt[n]/max(steps,1):7.1f}/step {tot[n]/max(steps,1):9.1f} us/step {tot[n]/cnt[n]:8.2f} us each")
print(f"{'all kernels':60s} {len(rows)/max(steps,1):7.1f}/step {s/max(steps,1):9.1f} us/step")
PY
done
echo "done ($((SECONDS-t0)) s)"
