#!/usr/bin/env bash
# Seventh session (H100, $OUT set): telemetry of the per-row / per-block recipes
# on the GPU against the CPU (selftest), and in a short training run's metrics.
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-200 | head -20
grep -E "^telemetry" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-400
for r in rowwise mxfp8 nvfp4; do
  $bin train --device cuda --steps 50 --recipe $r --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs --name t-$r > /dev/null 2>&1 || echo "train $r failed"
  python3 - $r <<'PY'
import json, sys
r = sys.argv[1]
rows = [json.loads(l) for l in open(f"/tmp/runs/t-{r}/metrics.jsonl") if '"telemetry"' in l]
t = rows[-1]["telemetry"]
print(r, "step", rows[-1]["step"], "layers", len(t), "first:", json.dumps(t[0])[:300])
PY
done
