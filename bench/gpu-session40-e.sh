#!/usr/bin/env bash
# Fortieth session, call e, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD
# with both wide 16-token shapes, 64 rows where those blocks fill the SMs, else
# 32 rows where those do). From a cold start: the full selftest (its 8456-row
# cases take the 64-row shape on 132 SMs); the small-M table twice; decode.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=$OUT; KN=4096x4096,4096x14336,8192x28672
{
timeout 300 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
gzip -9 $R/selftest.txt
for rep in 1 2; do
  dev-bin/octet bench mixed --device cuda --m 1,4,8,12,16,32,64 --kn $KN > $R/mixed-$rep.txt 2>&1
  echo "== rep $rep rc=$? ($((SECONDS-t0)) s)"
  echo "copy share: $(mixed_ratios $R/mixed-$rep.txt copy)"
  grep -E 'mixed speedup' $R/mixed-$rep.txt | grep graph | sed 's/   */ /g' | awk '{print $4, $5, $6, $(NF-2)}' | paste -sd' '
done
timeout 200 dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
