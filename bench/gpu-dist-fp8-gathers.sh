#!/usr/bin/env bash
# FP8 all-gathers of one recipe on 2 GPUs ($OUT set):
#   bench/gpu-dist-fp8-gathers.sh delayed|blockwise
# dev-bin/octet is the binary under test, dev-bin/octet-old one that gathers
# this recipe's weights in bf16 (fe09519), same call:
# - the selftest (the 1-rank sharded model of each recipe against the plain one);
# - small model (delayed only: its widths are not multiples of 512), 2 ranks:
#   losses against the old binary's (bit-identical expected), with and
#   without resharding, and against 1 GPU;
# - ~1B model, 2 ranks: every step's loss against the old binary's
#   (bit-identical expected), tok/s, peak memory and all-gather bytes; with
#   resharding too.
set -uo pipefail
recipe=${1:?delayed or blockwise}
export NCCL_NVLS_ENABLE=0
new=dev-bin/octet
old=dev-bin/octet-old
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
t0=$SECONDS
$new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|sharded|all .* cases" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-150
compare() { # dir: each run's losses against the old binary's
  python3 - "$1" <<'PY'
import json, os, sys
d = sys.argv[1]
def curve(n, key="loss"):
    p = f"{d}/{n}/metrics.jsonl"
    if not os.path.exists(p): return []
    return [r[key] for r in (json.loads(l) for l in open(p)) if key in r]
o = curve("old")
for n in ["new", "new-rs"]:
    a = curve(n)
    print(f"{d} {n}: {sum(x == y for x, y in zip(a, o))} of {len(o)} losses bit-identical to the old binary's; val {curve(n, 'val_loss')} vs {curve('old', 'val_loss')}")
one, two = curve("one"), curve("new")
if one and two:
    print(f"{d}: 1 GPU vs 2 ranks worst relative loss difference {max(abs(x - y) / x for x, y in zip(one, two)):.2e} over {len(one)} steps")
PY
}
runs() { # dir, common args: new, old, new with resharding (2 ranks); one (1 GPU) if asked
  local dir=$1 one=$2; shift 2
  rm -rf $dir  # a run of the same name appends to its metrics
  for v in new old new-rs $one; do
    local bin=$new extra="--nproc 2"
    [ $v = old ] && bin=$old
    [ $v = new-rs ] && extra="--nproc 2 --reshard-after-forward"
    [ $v = one ] && extra=""
    $bin train "$@" --out-dir $dir --name $v $extra > $OUT/$(basename $dir)-$v.txt 2>&1 || { echo "$dir $v failed"; tail -3 $OUT/$(basename $dir)-$v.txt; continue; }
    python3 - "$dir/$v" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl") if '"loss"' in l]
tok = sorted(r["tokens_per_s"] for r in rows[2:])
print(f"{sys.argv[1]}: tok/s median {tok[len(tok)//2]:.0f} (min {tok[0]:.0f}, max {tok[-1]:.0f}); peak device {max(r.get('device_bytes', 0) for r in rows)/2**30:.2f} GiB; final loss {rows[-1]['loss']:.4f}")
PY
    grep -h "NCCL per step" $OUT/$(basename $dir)-$v.txt
  done
  compare $dir
}
if [ $recipe = delayed ]; then
  runs /tmp/small one --device cuda --model small --steps 30 --batch 16 --seq 256 --eval-batches 2 --sample-tokens 0 --no-save --recipe $recipe
fi
runs /tmp/big "" --device cuda --model 1b --seq 2048 --steps 8 --eval-batches 0 --sample-tokens 0 --no-save --recipe $recipe --batch 8
echo "total $((SECONDS-t0)) s"
