#!/usr/bin/env bash
# Thirty-eighth session, call h ($OUT set; carry dev-bin: octet.gz = HEAD after the
# review mend: the bf16 decodes share one bit-placement helper, the bf16 block
# kernels load through the wgmma loader). The full selftest; block128 at M = 2048.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
R=/tmp/r38h; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 300 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
$B bench mixed --device cuda --m 2048 --kn 8192x28672 > $R/mixed.txt 2>&1
echo "bench rc=$?: $(grep -E '^mixed.*(block128|per-channel K).*M=2048 ' $R/mixed.txt | sed 's/   */ /g' | awk '{print $4, $(NF-2)}' | paste -sd' ')"
cp $R/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
