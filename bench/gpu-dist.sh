#!/usr/bin/env bash
# Sharded data parallel on a machine of 2 (or more) GPUs, with a binary built
# on the CPU machine (dev-bin/octet):
#   bench/gpu-dist.sh OUT_DIR [quick|full]
# quick: the selftest (NCCL communicator of one rank included), 1 vs 2 ranks
# on the small model (bf16, tensorwise), a rank killed mid-run.
# full: also the ~1B model, 1 GPU vs 2 GPUs at the same per-GPU batch.
set -uo pipefail
out="${1:?output directory}"
mode="${2:-quick}"
bin=dev-bin/octet
mkdir -p "$out"
exec > >(tee -a "$out/log.txt") 2>&1
# NVLink multicast stays off on these machines (see the device notes).
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
ngpu=$(nvidia-smi -L | wc -l)
if [ "$mode" = quick ]; then
echo "== selftest (GPU 0)"
$bin selftest --device cuda > "$out/selftest.txt" 2>&1; echo "selftest rc=$?"
grep -E "FAIL|sharded|all .* cases" "$out/selftest.txt"
echo "== small model, 1 GPU vs 2 ranks, same global batch (16 x 256), 60 steps"
for r in bf16 tensorwise; do
  common="--device cuda --model small --steps 60 --batch 16 --seq 256 --eval-batches 4 --sample-tokens 0 --no-save --recipe $r --out-dir /tmp/dist"
  $bin train $common --name one-$r 2>&1 | grep -E "Error|error|peak" | sed "s/^/1 GPU $r: /"
  $bin train $common --name two-$r --nproc 2 2>&1 | grep -E "Error|error|peak|NCCL|rank" | sed "s/^/2 ranks $r: /"
done
python3 - <<'PY'
import json
def curve(n):
    return {r["step"]: r for r in (json.loads(l) for l in open(f"/tmp/dist/{n}/metrics.jsonl")) if "loss" in r}
for r in ["bf16", "tensorwise"]:
    a, b = curve(f"one-{r}"), curve(f"two-{r}")
    worst = max(abs(a[s]["loss"] - b[s]["loss"]) / a[s]["loss"] for s in a if s in b)
    last = max(a)
    print(f"{r}: steps {len(a)}/{len(b)}, worst relative loss difference {worst:.2e}, final loss {a[last]['loss']:.4f} vs {b[last]['loss']:.4f}, "
          f"val {a[last].get('val_loss')} vs {b[last].get('val_loss')}")
    for s in [1, 2, 3, 10, 30, 60]:
        if s in a and s in b:
            print(f"  step {s}: {a[s]['loss']:.6f} {b[s]['loss']:.6f}")
PY
echo "== a rank killed mid-run: the job must end with a message, the last checkpoint intact"
rm -rf /tmp/kill
( $bin train --device cuda --model small --steps 400 --batch 16 --seq 256 --eval-batches 0 --sample-tokens 0 \
    --ckpt-every 20 --nproc 2 --out-dir /tmp/kill --name k > "$out/kill.txt" 2>&1; echo "job rc=$?" >> "$out/kill.txt" ) &
job=$!
for i in $(seq 1 120); do
  n=$(grep -c '"loss"' /tmp/kill/k/metrics.jsonl 2>/dev/null || echo 0)
  [ "$n" -ge 45 ] && break; sleep 0.5
done
launcher=$(pgrep -f "out-dir /tmp/kill" | head -1)
victim=$(pgrep -P "$launcher" | tail -1)
t0=$(date +%s.%N); kill -9 "$victim"; echo "killed rank pid $victim after $n steps"
wait $job; t1=$(date +%s.%N)
python3 -c "print(f'job ended {float($t1)-float($t0):.1f} s after the kill')"
tail -3 "$out/kill.txt"
ls /tmp/kill/k/checkpoints/
last=$(ls -d /tmp/kill/k/checkpoints/step_* | tail -1)
$bin train --device cuda --model small --steps $(( $(basename $last | sed 's/step_0*//') + 5 )) --batch 16 --seq 256 --eval-batches 0 \
  --sample-tokens 0 --no-save --out-dir /tmp/kill --name resumed --resume "$last" 2>&1 | grep -E "resumed|Error|error" | head -3
fi
if [ "$mode" = full ]; then
echo "== ~1B Llama (d=2048, 16 layers), per-GPU batch 4 x 2048, 8 steps: 1 GPU (unsharded) vs $ngpu ranks"
for r in bf16 tensorwise; do
  common="--device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --recipe $r --out-dir /tmp/big"
  $bin train $common --batch 4 --name one-$r 2>&1 | tail -7 | sed "s/^/1 GPU $r: /"
  $bin train $common --batch $((4 * ngpu)) --nproc $ngpu --name n-$r 2>&1 | tail -9 | sed "s/^/$ngpu ranks $r: /"
done
fi
if [ "$mode" = wire ]; then
echo "== gradients reduce-scattered in bf16 vs f32: small model 2 ranks, 60 steps (loss), then ~1B tensorwise (speed)"
common="--device cuda --model small --steps 60 --batch 16 --seq 256 --eval-batches 4 --sample-tokens 0 --no-save --recipe tensorwise --out-dir /tmp/wire --nproc 2"
$bin train $common --name f32 2>&1 | grep -E "Error|error|NCCL" | sed "s/^/small f32 grads: /"
$bin train $common --name bf16 --grad-reduce bf16 2>&1 | grep -E "Error|error|NCCL" | sed "s/^/small bf16 grads: /"
python3 - <<'PY'
import json
def curve(n):
    return {r["step"]: r for r in (json.loads(l) for l in open(f"/tmp/wire/{n}/metrics.jsonl")) if "loss" in r}
a, b = curve("f32"), curve("bf16")
last = max(a)
print(f"final train {a[last]['loss']:.4f} (f32 grads) vs {b[last]['loss']:.4f} (bf16 grads); val {a[last].get('val_loss'):.4f} vs {b[last].get('val_loss'):.4f}")
PY
for w in f32 bf16; do
  OCTET_PROFILE=1 $bin train --device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save \
    --recipe tensorwise --batch $((4 * ngpu)) --nproc $ngpu --grad-reduce $w --out-dir /tmp/big --name w-$w 2>&1 \
    | grep -E "tensorwise |NCCL|peak|profile|^  [a-z]|Error|error" | sed "s/^/1b $w grads: /"
done
fi
