#!/usr/bin/env bash
# The GPU checks and measurements of LoRA on an FP8 base (issue 5), on the lent
# GPU machine, with a binary built on the CPU machine (dev-bin/octet):
#   bench/gpu-lora.sh OUT_DIR check   # selftest, small-model FP8-vs-bf16 base losses, GPU resume
#   bench/gpu-lora.sh OUT_DIR 1b      # ~1B model: peak memory and step time per base; PyTorch+PEFT
# Writes OUT_DIR/log.txt (everything printed) and the files named below.
set -uo pipefail
out="${1:?output directory}"
mode="${2:-check}"
bin=dev-bin/octet
mkdir -p "$out"
exec > >(tee "$out/log-$mode.txt") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv

if [ "$mode" = check ]; then
  echo "== selftest"
  $bin selftest --device cuda > "$out/selftest.txt" 2>&1; echo "selftest rc=$?"
  grep -E "FAIL|LoRA|all .* cases" "$out/selftest.txt"
  echo "== small model: train the default base (GPU), then LoRA on it, FP8 base vs bf16 base"
  $bin train --device cuda --out-dir /tmp/runs --name default --sample-tokens 0 2>&1 | grep -E "final|val loss|Error|error" | tail -3
  $bin lora --device cuda --base /tmp/runs/default/checkpoints/step_000300 --out-dir /tmp/runs --name lora \
    --compare-bf16 --sample-tokens 80 2>&1 | grep -v "^\s*$" | tail -25
  cp /tmp/runs/lora/metrics.jsonl "$out/small-lora-fp8.jsonl" 2>/dev/null
  cp /tmp/runs/lora-bf16base/metrics.jsonl "$out/small-lora-bf16.jsonl" 2>/dev/null
  cp /tmp/runs/lora-compare-bf16.png "$out/small-lora-compare-bf16.png" 2>/dev/null
  echo "== GPU LoRA resume: 20 steps vs 10 + resumed 10 (tiny model)"
  common="--device cuda --model tiny --steps 20 --batch 8 --seq 64 --eval-batches 0 --sample-tokens 0 --out-dir /tmp/res"
  $bin lora $common --name a --ckpt-every 10 > /tmp/res-a.txt 2>&1 || tail -5 /tmp/res-a.txt
  $bin lora $common --name b --resume /tmp/res/a/checkpoints/step_000010 > /tmp/res-b.txt 2>&1 || tail -5 /tmp/res-b.txt
  ls /tmp/res/a/checkpoints/step_000020
  python3 - <<'PY'
import json
a = [json.loads(l) for l in open("/tmp/res/a/metrics.jsonl") if '"loss"' in l]
b = [json.loads(l) for l in open("/tmp/res/b/metrics.jsonl") if '"loss"' in l]
la = {r["step"]: r["loss"] for r in a}
lb = {r["step"]: r["loss"] for r in b}
same = [s for s in lb if s in la and la[s] == lb[s]]
print(f"resumed steps {sorted(lb)}: {len(same)} of {len(lb)} losses bit-identical to the uninterrupted run")
PY
fi

if [ "$mode" = 1b ]; then
  echo "== ~1B Llama (d=2048, 16 layers, 16 heads, MLP 5632), LoRA r=16 on q,k,v,o,gate,up,down, batch 4 x 2048, 8 steps"
  for cfg in "fp8-tensorwise fp8 dequantized" "fp8-tensorwise fp8 quantized" "fp8-tensorwise bf16 dequantized" \
             "bf16 bf16 high_precision" "bf16 bf16 dequantized"; do
    set -- $cfg
    echo "-- base $1, compute $2, backward $3"
    $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name 1b-$1-$2-$3 2>&1 \
      | grep -E "LoRA on the GPU|^lora|peak device|Error|error"
    python3 - "$1-$2-$3" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/runs/1b-{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
ms = [1e3 * 8192 / r["tokens_per_s"] for r in rows[2:]]
print(f"   steps 3-8 step ms: median {sorted(ms)[len(ms)//2]:.1f}, min {min(ms):.1f}; peak device {rows[-1]['device_bytes']/2**30:.2f} GiB; saved {rows[-1]['saved_bytes']/2**30:.2f} GiB")
PY
  done
  [ "${SKIP_PEERS:-}" = 1 ] && exit 0
  echo "== PyTorch + PEFT bf16 LoRA peers"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/peft/*.whl 2>&1 | tail -2
  PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 python3 bench/peers_lora.py "$out/peers-lora-1b.json" 10 2>&1 | grep -E "tok/s|failed|Error" | tail -5
fi
