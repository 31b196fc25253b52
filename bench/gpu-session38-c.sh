#!/usr/bin/env bash
# Thirty-eighth session, call c ($OUT set; carry dev-bin: octet.gz = bf16 x's
# codes decoded by integer code and one bf16 multiply, each pair picked from its
# word by the byte permute's selector (four instructions a pair, against four and
# a shift for the upper pair), in the small-M kernels and the plain wgmma kernel;
# octet-old.gz = HEAD, cd52f5d). The full selftest of the new binary, then
# `octet bench mixed` at M = 1-16 and 256, 2048 on the issue's three weights, old
# and new in turn, twice.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r38c; mkdir -p $R
{
timeout 300 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin bench mixed --device cuda --m 1,4,8,12,16,256,2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$bin-$rep.txt 2>&1
    echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
    echo "copy share: $(mixed_ratios $R/mixed-$bin-$rep.txt copy)"
    echo "vs cuBLASLt: $(grep -E "^mixed.*(block128|per-channel K).*M=(256|2048) " $R/mixed-$bin-$rep.txt | sed 's/   */ /g' | awk '{print $4, $5, $6, $7, $(NF-2)}' | sed 's/K=//;s/N=/x/;s/M=//' | paste -sd' ')"
  done
done
cp $R/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
