#!/usr/bin/env bash
# Fortieth session, call a, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD,
# with the thirty-ninth session's CPU numerics fixes, which no GPU run has seen).
# From a cold start: the full selftest; the weight-only selftest with integer FP8
# conversions; issue 6's table on this GPU (copy floor, M = 1-16, 64, 256, 2048 on
# the three weights); decode speed with FP8 against bf16 weights; a short training run.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r40a; mkdir -p $R
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
cp $R/*.txt $R/*.json $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
