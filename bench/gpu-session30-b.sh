#!/usr/bin/env bash
# Thirtieth session, call b ($OUT set; carry dev-bin: octet = HEAD b66d250).
# Where a decode step of the ~1B model goes now: at ~1340 tok/s a step takes
# ~0.75 ms, while its 823 MB of FP8 matrices (and the 1 MB bf16 head) read at
# copy speed would take ~0.28 ms. (The script of session 28 call b, rerun.)
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
# 4. If nsys is there: the same FP8 run traced with the graph's nodes (kernels
#    overlap as they do outside a profiler), kernel sums.
NSYS=$(command -v nsys || ls /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/bin/nsys 2>/dev/null | head -1)
echo "nsys: $NSYS" | tee -a $R/summary.txt
if [ -n "$NSYS" ]; then
  for wts in fp8 bf16; do
    $NSYS profile --cuda-graph-trace=node -o $T/nsys-$wts -f true \
      dev-bin/octet generate --random-model 1b --device cuda --weights $wts --max-tokens 256 --temperature 0 \
      > $T/nsys-$wts.out 2>&1
    echo "nsys $wts rc=$? ($((SECONDS-t0)) s)" | tee -a $R/summary.txt
    $NSYS stats --report cuda_gpu_kern_sum --format csv -o $R/kern-$wts $T/nsys-$wts.nsys-rep > /dev/null 2>&1
    head -25 $R/kern-$wts*.csv | cut -c1-220 >> $R/summary.txt
    $NSYS stats --report cuda_gpu_trace --format csv -o $T/trace-$wts $T/nsys-$wts.nsys-rep > /dev/null 2>&1
    python3 - $T/trace-$wts*.csv $wts >> $R/summary.txt <<'PY'
import csv, sys, statistics as st
rows = list(csv.DictReader(open(sys.argv[1])))
k = [(int(r["Start (ns)"]), int(r["Duration (ns)"]), r["Name"]) for r in rows if r.get("Start (ns)") and "[CUDA" not in r["Name"]]
k.sort()
starts = [i for i, (_, _, n) in enumerate(k) if n.startswith("embed_row")]
span, busy, kern = [], [], []
for a, b in zip(starts[-201:], starts[-200:]):
    ks = k[a:b]
    span.append((k[b][0] - ks[0][0]) / 1e3)
    # busy: the union of the kernels' intervals (PDL lets them overlap)
    u, end = 0, 0
    for t, d, _ in ks:
        u += max(0, t + d - max(t, end)); end = max(end, t + d)
    busy.append(u / 1e3); kern.append(len(ks))
print(f"== {sys.argv[2]} trace: {len(span)} steps, median span {st.median(span):.1f} us, "
      f"busy {st.median(busy):.1f} us, idle {st.median(span) - st.median(busy):.1f} us, {st.median(kern):.0f} kernels a step")
# the largest idle gap of a step: between the last kernel of a step and the next embed
g = [(k[b][0] - max(t + d for t, d, _ in k[a:b])) / 1e3 for a, b in zip(starts[-201:], starts[-200:])]
print(f"   gap from a step's last kernel end to the next step's embed: median {st.median(g):.1f} us")
PY
  done
fi
echo "done ($((SECONDS-t0)) s)"
