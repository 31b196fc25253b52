#!/usr/bin/env python3
"""Per-kernel totals of an ncu CSV (`--metrics gpu__time_duration.sum --csv`),
for the GPU bench scripts: launches, mean microseconds and milliseconds summed.

    python3 bench/ncu_kernels.py NCU.csv
"""
import collections
import csv
import sys

rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
hdr = rows[0]
ki, vi = hdr.index("Kernel Name"), hdr.index("Metric Value")
t = collections.defaultdict(list)
for r in rows[1:]:
    t[r[ki]].append(float(r[vi].replace(",", "")))
for k, v in t.items():
    print(f"  ncu {k}: {len(v)} launches, {sum(v) / len(v) / 1e3:.1f} us each, {sum(v) / 1e6:.2f} ms")
