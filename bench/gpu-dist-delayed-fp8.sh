#!/usr/bin/env bash
# Delayed scaling's FP8 all-gathers on 2 GPUs ($OUT set). dev-bin/octet is the
# binary under test, dev-bin/octet-old one that gathers delayed weights in bf16
# (fe09519), same call:
# - the selftest (1-rank sharded delayed model against the plain one);
# - small model, delayed, 2 ranks: losses against the old binary's (bit-identical
#   expected: the same codes, and the same amax once AdamW max-reduces it), with
#   and without resharding, and against 1 GPU;
# - ~1B model, delayed, 2 ranks: tok/s, peak memory and all-gather bytes, new vs old.
set -uo pipefail
export NCCL_NVLS_ENABLE=0
new=dev-bin/octet
old=dev-bin/octet-old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$SECONDS
$new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|sharded|all .* cases" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-160
small="--device cuda --model small --steps 30 --batch 16 --seq 256 --eval-batches 2 --sample-tokens 0 --no-save --out-dir /tmp/dl --recipe delayed"
$new train $small --name new --nproc 2 > $OUT/small-new.txt 2>&1 || { echo "small new failed"; tail -5 $OUT/small-new.txt; }
$new train $small --name new-rs --nproc 2 --reshard-after-forward > $OUT/small-new-rs.txt 2>&1 || { echo "small new rs failed"; tail -5 $OUT/small-new-rs.txt; }
$old train $small --name old --nproc 2 > $OUT/small-old.txt 2>&1 || echo "small old failed"
$new train $small --name one > /dev/null 2>&1 || echo "small one failed"
grep -h "NCCL per step" $OUT/small-new.txt $OUT/small-old.txt
python3 - <<'PY'
import json, os
def curve(n, key="loss"):
    p = f"/tmp/dl/{n}/metrics.jsonl"
    if not os.path.exists(p): return []
    return [r[key] for r in (json.loads(l) for l in open(p)) if key in r]
o = curve("old")
for n in ["new", "new-rs"]:
    a = curve(n)
    print(f"small delayed {n}: {sum(x == y for x, y in zip(a, o))} of {len(o)} losses bit-identical to the old binary's 2-rank run; val {curve(n, 'val_loss')} vs {curve('old', 'val_loss')}")
one, two = curve("one"), curve("new")
print(f"small delayed: 1 GPU vs 2 ranks worst relative loss difference {max(abs(x - y) / x for x, y in zip(one, two)):.2e} over {len(one)} steps")
PY
big="--device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/big --recipe delayed --batch 8 --nproc 2"
for v in new old new-rs; do
  bin=$new; extra=""
  [ $v = old ] && bin=$old
  [ $v = new-rs ] && extra="--reshard-after-forward"
  $bin train $big --name $v $extra > $OUT/big-$v.txt 2>&1 || { echo "1b $v failed"; tail -3 $OUT/big-$v.txt; continue; }
  python3 - "$v" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/big/{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
tok = sorted(r["tokens_per_s"] for r in rows[2:])
print(f"1b delayed {sys.argv[1]}: tok/s median {tok[len(tok)//2]:.0f} (min {tok[0]:.0f}, max {tok[-1]:.0f}); peak device {max(r.get('device_bytes', 0) for r in rows)/2**30:.2f} GiB; loss {rows[-1]['loss']:.4f}")
PY
  grep -h "NCCL per step" $OUT/big-$v.txt
done
echo "total $((SECONDS-t0)) s"
