#!/usr/bin/env bash
# Resharding after forward on 2 GPUs ($OUT set; dev-bin/octet): the selftest
# (the 1-rank sharded cases with and without resharding), a small-model loss
# check of 2 ranks with and without it, and the ~1B model's tok/s and peak
# memory per GPU with and without it, bf16 and tensorwise (FP8 gathers).
set -uo pipefail
bin=dev-bin/octet
export NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|sharded|all .* cases" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200
common="--device cuda --model small --steps 30 --batch 16 --seq 256 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/rs --nproc 2"
for r in bf16 tensorwise; do
  $bin train $common --recipe $r --name s-$r > /dev/null 2>&1 || echo "small $r failed"
  $bin train $common --recipe $r --name s-$r-rs --reshard-after-forward > $OUT/small-$r-rs.txt 2>&1 || { echo "small $r reshard failed"; tail -3 $OUT/small-$r-rs.txt; }
done
python3 - <<'PY'
import json
def curve(n):
    return [r["loss"] for r in (json.loads(l) for l in open(f"/tmp/rs/{n}/metrics.jsonl")) if "loss" in r]
for r in ["bf16", "tensorwise"]:
    a, b = curve(f"s-{r}"), curve(f"s-{r}-rs")
    same = sum(x == y for x, y in zip(a, b))
    print(f"small {r}: {same} of {len(a)} losses bit-identical with resharding ({len(b)} steps)")
PY
big="--device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/big --batch 8 --nproc 2"
for r in bf16 tensorwise; do
  for rs in "" "--reshard-after-forward"; do
    $bin train $big --recipe $r --name b-$r$rs $rs > $OUT/big-$r$rs.txt 2>&1 || { echo "1b $r $rs failed"; tail -3 $OUT/big-$r$rs.txt; }
    python3 - "b-$r$rs" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/big/{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
tok = sorted(r["tokens_per_s"] for r in rows[2:])
print(f"{sys.argv[1]}: tok/s median {tok[len(tok)//2]:.0f}; peak device {max(r.get('device_bytes', 0) for r in rows)/2**30:.2f} GiB; loss {rows[-1]['loss']:.4f}")
PY
    grep -iE "all-gather|all_gather" $OUT/big-$r$rs.txt | head -2
  done
done
