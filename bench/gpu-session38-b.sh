#!/usr/bin/env bash
# Thirty-eighth session, call b ($OUT set; carry dev-bin: octet.gz = the wgmma
# kernel scaling 128x128-block codes in bf16 arithmetic for bf16 x: the codes'
# bits shifted into a bf16, times the factor split into two bf16, five
# instructions a pair against six in f32). The full selftest, then `octet bench
# mixed --m 256,2048` on the issue's three weights with the bf16 scaling and
# with OCTET_MIXED_BLOCK=f32 (the f32 scaling), in turn, twice.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
R=/tmp/r38b; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 300 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -E "scaled in (bf16|f32)" $R/selftest.txt | cut -c1-160
for rep in 1 2; do
  for mode in bf16 f32; do
    if [ $mode = f32 ]; then export OCTET_MIXED_BLOCK=f32; else unset OCTET_MIXED_BLOCK; fi
    $B bench mixed --device cuda --m 256,2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$mode-$rep.txt 2>&1
    echo "== $mode rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "^mixed.*(block128|per-channel K).*M=(256|2048) " $R/mixed-$mode-$rep.txt | sed 's/   */ /g' | awk '{print $4, $5, $6, $7, $(NF-2)}' | paste -sd' '
  done
done
unset OCTET_MIXED_BLOCK
cp $R/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
