#!/usr/bin/env bash
# One device call (H100, $OUT set): every recipe on the small model (the README's
# default run, convergence against bf16), the GPU resume check, and the ~1B LoRA
# step per base with the PyTorch + PEFT peers.   bash bench/gpu-session6-b.sh
set -uo pipefail
bin=dev-bin/octet
echo "== every recipe on the small model, GPU"
timeout 240 $bin compare --device cuda --out-dir /tmp/cmp --name gpu \
  --recipes bf16,delayed,tensorwise,rowwise,blockwise,mxfp8,nvfp4 2>&1 | grep -v "^\s*$" | tail -14
cp /tmp/cmp/gpu-compare.json /tmp/cmp/gpu-compare.png "$OUT/" 2>/dev/null
echo "== resume on the GPU: 20 steps vs 10 + resumed 10 (tiny model, tensorwise)"
common="--device cuda --model tiny --steps 20 --batch 8 --seq 64 --eval-batches 0 --sample-tokens 0 --out-dir /tmp/res"
$bin train $common --name a --ckpt-every 10 > /dev/null 2>&1
$bin train $common --name b --resume /tmp/res/a/checkpoints/step_000010 > /dev/null 2>&1
python3 - <<'PY'
import json
a = [json.loads(l) for l in open("/tmp/res/a/metrics.jsonl") if '"loss"' in l]
b = [json.loads(l) for l in open("/tmp/res/b/metrics.jsonl") if '"loss"' in l]
la = {r["step"]: r["loss"] for r in a}; lb = {r["step"]: r["loss"] for r in b}
same = [s for s in lb if s in la and la[s] == lb[s]]
print(f"resumed steps {min(lb)}-{max(lb)}: {len(same)} of {len(lb)} losses bit-identical to the uninterrupted run")
PY
bash bench/gpu-lora.sh $OUT 1b 2>&1 | grep -v "^name\|NVIDIA"
