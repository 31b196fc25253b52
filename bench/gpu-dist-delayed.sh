#!/usr/bin/env bash
# Delayed scaling under sharded data parallel (2 GPUs, $OUT set): the small model,
# 1 GPU against 2 ranks at the same global batch (16 x 256), with the step amaxes
# max-reduced over the ranks (dev-bin/octet) and without (dev-bin/octet-old, when present).
set -uo pipefail
export NCCL_NVLS_ENABLE=0
common="--device cuda --model small --steps 30 --batch 16 --seq 256 --eval-batches 0 --sample-tokens 0 --no-save --recipe delayed --out-dir /tmp/dd"
dev-bin/octet train $common --name one > /dev/null 2>&1 || echo "1 GPU run failed"
dev-bin/octet train $common --name two --nproc 2 2>&1 | grep -E "Error|error" | head -3
[ -x dev-bin/octet-old ] && { dev-bin/octet-old train $common --name old --nproc 2 2>&1 | grep -E "Error|error" | head -3; }
python3 - <<'PY'
import json, os
def curve(n):
    p = f"/tmp/dd/{n}/metrics.jsonl"
    return {r["step"]: r["loss"] for r in (json.loads(l) for l in open(p)) if "loss" in r} if os.path.exists(p) else {}
one = curve("one")
for n, label in [("two", "2 ranks, amaxes max-reduced"), ("old", "2 ranks, per-rank histories")]:
    c = curve(n)
    if not c:
        continue
    rel = {s: abs(one[s] - c[s]) / one[s] for s in c if s in one}
    print(f"{label}: worst relative loss difference vs 1 GPU over {len(rel)} steps {max(rel.values()):.2e}; "
          f"steps 1-5: " + ", ".join(f"{rel[s]:.1e}" for s in sorted(rel)[:5]) + f"; final {one[max(one)]:.4f} vs {c[max(c)]:.4f}")
PY
