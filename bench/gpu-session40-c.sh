#!/usr/bin/env bash
# Fortieth session, call c, one H200 ($OUT set; carry dev-bin: octet.gz = HEAD
# with the wide 16-token shape, SMALL_WIDE: 32 weight rows a block where those
# blocks still fill the SMs). The full selftest (its 4240- and 2088-row cases
# take the wide shape on 132 SMs); then issue 6's table, HEAD's choice against
# the table's old 16-token shape (OCTET_MIXED_TUNE=2:4:3:1), in turn, twice.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=$OUT; KN=4096x4096,4096x14336,8192x28672
{
timeout 300 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
for rep in 1 2; do
  for c in head old; do
    tune=table; [ $c = old ] && tune=2:4:3:1
    OCTET_MIXED_TUNE=$tune dev-bin/octet bench mixed --device cuda --m 1,4,8,12,16,32,64,256,2048 --kn $KN --json $R/mixed-$c-$rep.json > $R/mixed-$c-$rep.txt 2>&1
    echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s)"
    echo "copy share: $(mixed_ratios $R/mixed-$c-$rep.txt copy)"
    grep -E '^gemm bf16 cuBLASLt.*M=(12|16|32|64) .*graph' $R/mixed-$c-$rep.txt | sed 's/   */ /g' | awk '{print $5, $6, $7, $(NF-1)}' | paste -sd' '
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
