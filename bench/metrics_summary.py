#!/usr/bin/env python3
"""One line about a run's metrics.jsonl, for the GPU bench scripts.

    python3 bench/metrics_summary.py METRICS TOKENS_PER_STEP [FIRST_STEP]

Prints the step time (median from FIRST_STEP on, default 3), tokens/s over the
same steps, the peak device memory by step (the driver's used memory), the peak
allocated memory (the memory pool's high-water mark, when recorded), the pool's
reserved high-water mark (allocated or cached, when recorded), the saved
bytes, the first four losses and the last one.
"""
import json
import sys

rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tok = int(sys.argv[2])
first = int(sys.argv[3]) if len(sys.argv) > 3 else 3
steady = [r for r in rows if r["step"] >= first] or rows
ms = sorted(1e3 * tok / r["tokens_per_s"] for r in steady)
tps = tok * len(steady) / sum(tok / r["tokens_per_s"] for r in steady)
dev = " ".join(f"{r['device_bytes'] / 2**30:.2f}" for r in rows if r.get("device_bytes"))
alloc = max((r.get("allocated_bytes") or 0) for r in rows) / 2**30
resv = max((r.get("reserved_bytes") or 0) for r in rows) / 2**30
print(
    f"   steps {first}-{rows[-1]['step']}: step ms median {ms[len(ms) // 2]:.1f} (min {ms[0]:.1f}), "
    f"{tps:.0f} tokens/s; peak device by step {dev} GiB; peak allocated {alloc:.2f} GiB; "
    f"peak reserved {resv:.2f} GiB; "
    f"saved {rows[-1]['saved_bytes'] / 2**30:.2f} GiB; first losses {[round(r['loss'], 4) for r in rows[:4]]}, "
    f"loss at step {rows[-1]['step']} {rows[-1]['loss']:.4f}"
)
