#!/usr/bin/env bash
# Thirty-sixth session, call b ($OUT set; carry dev-bin: octet.gz = HEAD fc2c761
# plus the delayed selftest cases below). The review's fixes: delayed scaling
# keeps its scale on a window amax of 0 and applies the margin before the
# division, in delayed.cu too. The full selftest (delayed cases: device against
# the CPU, bit for bit, now with a zero step and tiny amaxes with a margin),
# then call a's resume check with this binary.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r36b; mkdir -p $R
same_losses() { # run dir A, run dir B: steps of B whose loss differs from A's
  python3 - "$1/metrics.jsonl" "$2/metrics.jsonl" <<'PY'
import json, sys
def losses(p):
    out = {}
    for line in open(p):
        d = json.loads(line)
        if d.get("loss") is not None and "step" in d:
            out[d["step"]] = repr(d["loss"])
    return out
a, b = losses(sys.argv[1]), losses(sys.argv[2])
steps = sorted(b)
diff = [s for s in steps if a.get(s) != b[s]]
print(f"resumed steps {steps}: {len(diff)} differ {diff}; " + ", ".join(f"{s}: {a.get(s)} / {b[s]}" for s in steps))
PY
}
{
timeout 400 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10
grep -a -E "gradient quantization rounds|delayed scaling on the device" $R/selftest.txt | tr -s ' ' | cut -c1-300
for bin in octet; do
  for recipe in nvfp4 delayed; do
    O=$R/runs-$bin
    common="--device cuda --model tiny --recipe $recipe --backward quantized --warmup 2 --steps 6 --ckpt-every 3 --out-dir $O"
    timeout 120 dev-bin/$bin train $common --name full-$recipe > $R/$bin-full-$recipe.txt 2>&1
    rc1=$?
    timeout 120 dev-bin/$bin train $common --name res-$recipe --resume $O/full-$recipe/checkpoints/step_000003 > $R/$bin-res-$recipe.txt 2>&1
    rc2=$?
    echo "$bin $recipe: rc $rc1 / $rc2 ($((SECONDS-t0)) s): $(same_losses $O/full-$recipe $O/res-$recipe)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
tail -n 3 $R/*-res-*.txt > $OUT/resume-tails.txt
