#!/usr/bin/env bash
# Twenty-eighth session, call c ($OUT set; carry dev-bin: octet-old = HEAD
# 5a4c3ac, octet = the decode step with fused glue: residual add + norm in one
# 1024-thread block, rotary + cache store in one kernel from f32 tables, and
# an attention kernel with a warp a position (211 -> 147 kernels a step on the
# ~1B model)). Call b found the glue at ~830 of the 1398 us of a step (ncu).
# 1. the full selftest (the decoding cases now run 48 and 200 tokens);
# 2. decode old / new, FP8 and bf16 weights, two rounds;
# 3. ncu over the last steps of a 256-token FP8 run, old and new: every
#    kernel's duration, caches left warm (--cache-control none).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
T=/tmp/r; mkdir -p $T
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
grep -a "decode" $R/selftest.txt | tee -a $R/summary.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > $T/generate.txt 2>&1
    echo "generate $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $T/generate.txt)"
  done
done | tee -a $R/summary.txt
for spec in "octet-old 53500 2200" "octet 37300 1500"; do
  read bin skip count <<< "$spec"
  ncu --clock-control none --cache-control none --graph-profiling node --metrics gpu__time_duration.sum --csv \
    --launch-skip $skip --launch-count $count \
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --max-tokens 256 --temperature 0 \
    > $T/ncu-$bin.csv 2> $T/ncu-$bin.err
  echo "ncu $bin rc=$? ($((SECONDS-t0)) s): $(wc -l < $T/ncu-$bin.csv) lines" | tee -a $R/summary.txt
  tail -2 $T/ncu-$bin.err >> $R/summary.txt
  python3 - $T/ncu-$bin.csv $bin >> $R/summary.txt <<'PY'
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
    rows.append((r["Kernel Name"].split("(")[0], us, unit))
steps = sum(1 for n, _, _ in rows if n.startswith("embed_row"))
print(f"== {sys.argv[2]}: {len(rows)} kernels, {steps} steps (unit {rows[0][2] if rows else '?'})")
tot = collections.defaultdict(float); cnt = collections.Counter()
for n, us, _ in rows:
    tot[n] += us; cnt[n] += 1
s = sum(tot.values())
for n in sorted(tot, key=lambda n: -tot[n]):
    print(f"{n[:60]:60s} {cnt[n]/max(steps,1):7.1f}/step {tot[n]/max(steps,1):9.1f} us/step {tot[n]/cnt[n]:8.2f} us each")
print(f"{'all kernels':60s} {len(rows)/max(steps,1):7.1f}/step {s/max(steps,1):9.1f} us/step")
PY
done
echo "done ($((SECONDS-t0)) s)"
