#!/usr/bin/env bash
# Forty-third session, call a, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD:
# stepped copies for the few-block shape, paired warps taken out). The record for
# issue 6's closing note, as the fortieth session's call a: the full selftest; the
# weight-only selftest with integer FP8 conversions; issue 6's table (M = 1-16, 64,
# 256, 2048 on the three weights), twice; decode with FP8 against bf16 weights; a
# short training run. Then the forty-second session's open lead: the few-block shape
# (2:8:2:2:1) against the table at 9 and 12 tokens on more weights with K = 8192.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r43a; mkdir -p $R
B=$PWD/dev-bin/octet
{
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
timeout 300 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed timeout 200 $B selftest --device cuda > $R/selftest-soft.txt 2>&1
echo "soft mixed selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-soft.txt | head -3)"
for rep in 1 2; do
  timeout 200 $B bench mixed --device cuda --m 1,4,8,12,16,64,256,2048 --kn 4096x4096,4096x14336,8192x28672 --json $R/mixed-$rep.json > $R/mixed-$rep.txt 2>&1
  echo "== bench mixed rep $rep rc=$? ($((SECONDS-t0)) s)"
  echo "copy share: $(mixed_ratios $R/mixed-$rep.txt copy)"
done
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
(cd $R; timeout 120 $B train --device cuda --model tiny --steps 20 --out-dir $R/runs --name t > t.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(tail -1 t.txt | cut -c1-200)")
run() {  # ROUND TUNE
  OCTET_MIXED_TUNE=$2 timeout 100 $B bench mixed --device cuda --m 9,12 --kn 8192x8192,8192x14336,8192x28672,4096x28672 > $R/lead-$1-$2.txt 2>&1
  echo "== lead round $1 tune $2 rc=$? ($((SECONDS-t0)) s)"; tiled_vs_row $R/lead-$1-$2.txt
}
run 1 table; run 1 2:8:2:2:1; run 2 2:8:2:2:1; run 2 table
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R --exclude runs .
