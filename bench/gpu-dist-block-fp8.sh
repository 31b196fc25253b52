#!/usr/bin/env bash
# Blockwise (128x128 weight blocks) FP8 all-gathers on 2 GPUs ($OUT set).
# dev-bin/octet is the binary under test, dev-bin/octet-old one that gathers
# blockwise weights in bf16 (fe09519), same call:
# - the selftest (the 1-rank sharded blockwise model against the plain one);
# - ~1B model, blockwise, 2 ranks: every step's loss against the old binary's
#   (bit-identical expected: a shard of whole block rows quantizes to the whole
#   weight's blocks), tok/s, peak memory and all-gather bytes; with resharding too.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
new=dev-bin/octet
old=dev-bin/octet-old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$SECONDS
$new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|sharded|all .* cases" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-150
big="--device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/big --recipe blockwise --batch 8 --nproc 2"
for v in new old new-rs; do
  bin=$new; extra=""
  [ $v = old ] && bin=$old
  [ $v = new-rs ] && extra="--reshard-after-forward"
  $bin train $big --name $v $extra > $OUT/big-$v.txt 2>&1 || { echo "1b $v failed"; tail -3 $OUT/big-$v.txt; continue; }
  python3 - "$v" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/big/{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
tok = sorted(r["tokens_per_s"] for r in rows[2:])
print(f"1b blockwise {sys.argv[1]}: tok/s median {tok[len(tok)//2]:.0f} (min {tok[0]:.0f}, max {tok[-1]:.0f}); peak device {max(r.get('device_bytes', 0) for r in rows)/2**30:.2f} GiB; losses {[round(r['loss'], 6) for r in rows]}")
PY
  grep -h "NCCL per step" $OUT/big-$v.txt
done
python3 - <<'PY'
import json
def curve(n):
    return [r["loss"] for r in (json.loads(l) for l in open(f"/tmp/big/{n}/metrics.jsonl")) if "loss" in r]
o = curve("old")
for n in ["new", "new-rs"]:
    a = curve(n)
    print(f"1b blockwise {n}: {sum(x == y for x, y in zip(a, o))} of {len(o)} losses bit-identical to the old binary's")
PY
echo "total $((SECONDS-t0)) s"
