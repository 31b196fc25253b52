#!/usr/bin/env bash
# Collectives on their own stream, overlapped with compute ($OUT set; 2 GPUs).
# dev-bin/octet is the binary under test, dev-bin/octet-old the one before
# (collectives on the compute stream), run in the same call:
# - the selftest (the 1-rank sharded cases check the stream ordering);
# - small model, 2 ranks: losses of the new binary against the old one's
#   (bit-identical expected: same collectives, same order of sums), with and
#   without resharding, and against 1 GPU;
# - ~1B model: tok/s and peak memory, 2 ranks new vs old, and 1 GPU new.
# Usage: bench/gpu-dist-overlap.sh check|big
set -uo pipefail
mode=${1:?check or big}
export NCCL_NVLS_ENABLE=0
new=dev-bin/octet
old=dev-bin/octet-old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$SECONDS
if [ "$mode" = check ]; then
$new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|sharded|all .* cases" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-220
small="--device cuda --model small --steps 30 --batch 16 --seq 256 --eval-batches 2 --sample-tokens 0 --no-save --out-dir /tmp/ov"
for r in bf16 tensorwise; do
  $new train $small --recipe $r --name new-$r --nproc 2 > $OUT/small-new-$r.txt 2>&1 || { echo "small new $r failed"; tail -5 $OUT/small-new-$r.txt; }
  $new train $small --recipe $r --name new-$r-rs --nproc 2 --reshard-after-forward > $OUT/small-new-$r-rs.txt 2>&1 || { echo "small new $r rs failed"; tail -5 $OUT/small-new-$r-rs.txt; }
  $new train $small --recipe $r --name new-$r-bf16rs --nproc 2 --grad-reduce bf16 > $OUT/small-new-$r-bf16rs.txt 2>&1 || { echo "small new $r bf16 grads failed"; tail -5 $OUT/small-new-$r-bf16rs.txt; }
  $old train $small --recipe $r --name old-$r --nproc 2 > /dev/null 2>&1 || echo "small old $r failed"
  $old train $small --recipe $r --name old-$r-bf16rs --nproc 2 --grad-reduce bf16 > /dev/null 2>&1 || echo "small old $r bf16 grads failed"
  $new train $small --recipe $r --name one-$r > /dev/null 2>&1 || echo "small one $r failed"
done
echo "small runs done ($((SECONDS-t0)) s)"
python3 - <<'PY'
import json, os
def curve(n, key="loss"):
    p = f"/tmp/ov/{n}/metrics.jsonl"
    if not os.path.exists(p): return []
    return [r[key] for r in (json.loads(l) for l in open(p)) if key in r]
for r in ["bf16", "tensorwise"]:
    o = curve(f"old-{r}")
    for n in [f"new-{r}", f"new-{r}-rs"]:
        a = curve(n)
        print(f"small {n}: {sum(x == y for x, y in zip(a, o))} of {len(o)} losses bit-identical to the old binary's 2-rank run; val {curve(n, 'val_loss')} vs {curve(f'old-{r}', 'val_loss')}")
    a, o2 = curve(f"new-{r}-bf16rs"), curve(f"old-{r}-bf16rs")
    print(f"small {r} bf16 reduce-scatter: {sum(x == y for x, y in zip(a, o2))} of {len(o2)} bit-identical to old")
    one, two = curve(f"one-{r}"), curve(f"new-{r}")
    if one and two:
        worst = max(abs(x - y) / x for x, y in zip(one, two))
        print(f"small {r}: 1 GPU vs 2 ranks worst relative loss difference {worst:.2e} over {len(one)} steps")
PY
fi
if [ "$mode" = big ]; then
big="--device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/big"
run() { # name bin args...
  local name=$1 bin=$2; shift 2
  $bin train $big --name $name "$@" > $OUT/big-$name.txt 2>&1 || { echo "1b $name failed"; tail -3 $OUT/big-$name.txt; return; }
  python3 - "$name" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"/tmp/big/{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
tok = sorted(r["tokens_per_s"] for r in rows[2:])
print(f"1b {sys.argv[1]}: tok/s median {tok[len(tok)//2]:.0f} (min {tok[0]:.0f}, max {tok[-1]:.0f}); peak device {max(r.get('device_bytes', 0) for r in rows)/2**30:.2f} GiB; loss {rows[-1]['loss']:.4f}")
PY
}
for r in bf16 tensorwise; do
  run new2-$r $new --recipe $r --batch 8 --nproc 2
  run old2-$r $old --recipe $r --batch 8 --nproc 2
  run new2rs-$r $new --recipe $r --batch 8 --nproc 2 --reshard-after-forward
  echo "($((SECONDS-t0)) s)"
done
for r in bf16 tensorwise; do
  run new1-$r $new --recipe $r --batch 4
done
grep -ihE "all-gather|all_gather" $OUT/big-new2-bf16.txt $OUT/big-new2-tensorwise.txt | head -4
echo "total $((SECONDS-t0)) s"
fi
