#!/usr/bin/env bash
# One device call (H100, $OUT set): conformance, and resume checks on the GPU for the
# delayed and tensorwise recipes (tiny model, 20 steps vs 10 + 10 resumed), with the
# delayed checkpoint also resumed on the CPU.   bash bench/gpu-session6-c.sh
set -uo pipefail
bin=dev-bin/octet
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|delayed states|amaxes|all .* cases" $OUT/selftest.txt | cut -c1-200
for r in delayed tensorwise; do
  common="--model tiny --steps 20 --batch 8 --seq 64 --eval-batches 0 --sample-tokens 0 --recipe $r --out-dir /tmp/res-$r"
  $bin train --device cuda $common --name a --ckpt-every 10 > /tmp/a-$r.txt 2>&1 || tail -3 /tmp/a-$r.txt
  $bin train --device cuda $common --name b --resume /tmp/res-$r/a/checkpoints/step_000010 > /tmp/b-$r.txt 2>&1 || tail -3 /tmp/b-$r.txt
  $bin train --device cpu $common --name c --resume /tmp/res-$r/a/checkpoints/step_000010 > /tmp/c-$r.txt 2>&1 || tail -3 /tmp/c-$r.txt
  R=$r python3 - <<'PY'
import json, os
r = os.environ["R"]
def losses(n):
    return {x["step"]: x["loss"] for x in (json.loads(l) for l in open(f"/tmp/res-{r}/{n}/metrics.jsonl")) if "loss" in x}
a, b, c = losses("a"), losses("b"), losses("c")
same = [s for s in b if a.get(s) == b[s]]
worst = max(abs(a[s] - c[s]) / a[s] for s in c)
print(f"{r}: GPU resumed steps {min(b)}-{max(b)}: {len(same)} of {len(b)} losses bit-identical to the uninterrupted GPU run; "
      f"resumed on the CPU: worst relative loss difference {worst:.2e} (step 11: GPU {a[11]:.6f}, CPU {c[11]:.6f})")
PY
done
python3 -c "
import json,struct
f=open('/tmp/res-delayed/a/checkpoints/step_000010/optimizer.safetensors','rb'); n=struct.unpack('<Q',f.read(8))[0]; h=json.loads(f.read(n))
s=json.loads(h['__metadata__']['scaling']); print('delayed checkpoint: scaling states', len(s), 'first', json.dumps(s[0])[:300])"
