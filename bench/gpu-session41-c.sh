#!/usr/bin/env bash
# Forty-first session, call c, one H200 (carry dev-bin: octet.gz = HEAD with
# SMALL_FEW, 8 warps x 2 stages x 32 rows for 16-token launches whose 32-row
# blocks fill more than half the SMs but not all). The full selftest (new cases
# take the shape), the weight-only one with integer conversions, the issue's
# bench twice, the rule's edges (2048x2048: 64 blocks; 4096x8192: 256), decode.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r; mkdir -p $R
{
timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3 | cut -c1-300)"
grep -a -E "3000|2992" $R/selftest.txt | sed 's/   */ /g' | head -3 | cut -c1-200
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed timeout 120 dev-bin/octet selftest --device cuda > $R/selftest-soft.txt 2>&1
echo "soft mixed selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-soft.txt | head -3 | cut -c1-300)"
for rep in 1 2; do
  timeout 120 dev-bin/octet bench mixed --device cuda --m 1,4,8,12,16,32,64 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$rep.txt 2>&1
  echo "== bench rep $rep rc=$? ($((SECONDS-t0)) s)"
  tiled_vs_row $R/mixed-$rep.txt
  grep -E "cuBLASLt|copy" $R/mixed-$rep.txt | head -3 | cut -c1-200
done
timeout 60 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 2048x2048,4096x8192 > $R/mixed-edges.txt 2>&1
echo "== edges rc=$? ($((SECONDS-t0)) s)"; tiled_vs_row $R/mixed-edges.txt
timeout 120 dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
