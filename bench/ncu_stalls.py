#!/usr/bin/env python3
"""One line per profiled kernel of an ncu CSV (`--csv`, metrics below): time,
DRAM throughput, instructions, warps active, issue rate, and the warp stall
reasons (cycles a warp spent in each, per issued instruction), largest first.

    python3 bench/ncu_stalls.py NCU.csv
"""
import collections
import csv
import sys

rows = list(csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')))
hdr = rows[0]
ki, ni, vi = hdr.index("Kernel Name"), hdr.index("Metric Name"), hdr.index("Metric Value")
idi = hdr.index("ID")
by = collections.OrderedDict()
for r in rows[1:]:
    by.setdefault((r[idi], r[ki]), {})[r[ni]] = float(r[vi].replace(",", "") or 0)
pre = "smsp__average_warps_issue_stalled_"
for (i, k), m in by.items():
    stalls = sorted(((v, n[len(pre):].replace("_per_issue_active.ratio", "")) for n, v in m.items()
                     if n.startswith(pre)), reverse=True)
    print(f"{k} #{i}: {m.get('gpu__time_duration.sum', 0) / 1e3:.2f} us, "
          f"dram {m.get('dram__throughput.avg.pct_of_peak_sustained_elapsed', 0):.1f}%, "
          f"inst {m.get('smsp__inst_executed.sum', 0) / 1e6:.2f} M, "
          f"warps {m.get('sm__warps_active.avg.per_cycle_active', 0):.1f}/SM, "
          f"issue {m.get('smsp__issue_active.avg.per_cycle_active', 0):.2f}; stalls: "
          + ", ".join(f"{n} {v:.2f}" for v, n in stalls[:7]))
