#!/usr/bin/env python3
"""GPU time of one training step by kernel, for comparing octet with a peer.

    python3 bench/kernel_table.py octet NCU.csv [ANCHOR]
    python3 bench/kernel_table.py torch KERNELS.json

`octet`: an `ncu --metrics gpu__time_duration.sum --csv` capture of several
steps; the step is the launches from the first ANCHOR kernel (default
`embed_fwd`, the step's first kernel) up to the next one.
`torch`: the JSON written by `PEERS_PROFILE=DIR bench/peers_train.py` (one
profiled step). Prints time by category and the 30 costliest kernels.
"""
import csv
import json
import re
import sys
from collections import defaultdict

CATEGORIES = [
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|sm90_|wgmma_gemm"),
    ("attention", r"attn|flash|fmha|sdpa|attention"),
    ("norm", r"rms|norm"),
    ("optimizer", r"adam|sumsq|multi_tensor|foreach|clip"),
    ("loss", r"cross_entropy|softmax|log_softmax|nll"),
]


def category(name):
    low = name.lower()
    for cat, pat in CATEGORIES:
        if re.search(pat, low):
            return cat
    return "other"


def octet_rows(path, anchor):
    rows = []
    with open(path) as f:
        lines = [l for l in f if l.startswith('"')]
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[r["Metric Unit"]]
        rows.append((r["Kernel Name"], float(r["Metric Value"].replace(",", "")) * scale))
    marks = [i for i, (n, _) in enumerate(rows) if n.startswith(anchor)]
    if len(marks) < 2:
        sys.exit(f"fewer than two '{anchor}' launches in {path}: capture more launches")
    step = rows[marks[0] : marks[1]]
    agg = defaultdict(lambda: [0.0, 0])
    for n, us in step:
        agg[n][0] += us
        agg[n][1] += 1
    return [(n, us, c) for n, (us, c) in agg.items()]


def torch_rows(path):
    return [(r["name"], r["us"], r["count"]) for r in json.load(open(path))]


def main():
    kind, path = sys.argv[1], sys.argv[2]
    rows = octet_rows(path, sys.argv[3] if len(sys.argv) > 3 else "embed_fwd") if kind == "octet" else torch_rows(path)
    total = sum(us for _, us, _ in rows)
    cats = defaultdict(float)
    for n, us, _ in rows:
        cats[category(n)] += us
    print(f"{kind}: {total / 1e3:.2f} ms of kernel time in the step, {sum(c for *_, c in rows)} launches")
    for cat, us in sorted(cats.items(), key=lambda kv: -kv[1]):
        print(f"  {cat:10s} {us / 1e3:8.2f} ms  {100 * us / total:5.1f}%")
    for n, us, c in sorted(rows, key=lambda r: -r[1])[:30]:
        print(f"    {us / 1e3:8.3f} ms  x{c:<5d} {n[:110]}")


if __name__ == "__main__":
    main()
