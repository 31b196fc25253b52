#!/usr/bin/env bash
# Thirty-eighth session, call a ($OUT set; carry dev-bin: octet.gz = the wgmma
# kernel rescaling its accumulators at 128x128 block boundaries, codes unscaled).
# The full selftest, then `octet bench mixed --m 256,2048` on the issue's three
# weights with the rescaling kernel and with OCTET_MIXED_BLOCK=upcast (the
# previous kernel, codes times factor in the upcast), in turn, twice.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
R=/tmp/r38a; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 300 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -E "2\^30 apart|2\^40 below|1e9 apart|up to 1e5" $R/selftest.txt | cut -c1-200
for rep in 1 2; do
  for mode in rescale upcast; do
    if [ $mode = upcast ]; then export OCTET_MIXED_BLOCK=upcast; else unset OCTET_MIXED_BLOCK; fi
    $B bench mixed --device cuda --m 256,2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$mode-$rep.txt 2>&1
    echo "== $mode rep $rep rc=$? ($((SECONDS-t0)) s)"
    grep -E "^mixed.*M=(256|2048)" $R/mixed-$mode-$rep.txt | sed 's/   */ /g' | awk '{print $4, $5, $6, $7, $(NF-2)}' | paste -sd' '
  done
done
unset OCTET_MIXED_BLOCK
cp $R/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
