#!/usr/bin/env bash
# Final device call of the sixth session (H100, $OUT set): conformance on the final
# binary, the ~1B step (bf16, tensorwise) and the attention kernels' times in one step.
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160
train="$bin train --device cuda --model 1b --batch 4 --seq 2048 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs"
for r in "bf16 quantized" "tensorwise quantized"; do
  set -- $r
  $train --steps 6 --recipe $1 --backward $2 --name f-$1 2>&1 | grep -E "^(bf16|i:)" | sed "s/^/$1: /" | cut -c1-200
done
timeout 200 ncu --clock-control none -k regex:attn_ --metrics gpu__time_duration.sum --csv --print-units base \
  $train --steps 2 --recipe bf16 --name n > $OUT/ncu-attn.csv 2>/dev/null
python3 - "$OUT/ncu-attn.csv" <<'PY'
import csv, collections, sys
lines = open(sys.argv[1]).read().splitlines()
start = [i for i, l in enumerate(lines) if l.startswith('"ID"')][0]
rows = list(csv.reader(lines[start:]))
h = rows[0]; ki, vi = h.index("Kernel Name"), h.index("Metric Value")
agg = collections.defaultdict(float)
for r in rows[1:]:
    agg[r[ki]] += float(r[vi].replace(",", ""))
for k, v in sorted(agg.items()):
    print(f"{k}: {v / 2e6:.2f} ms per step")
PY
