#!/usr/bin/env bash
# Thirty-eighth session, call e ($OUT set; carry dev-bin: octet.gz = HEAD, with the
# new selftest case that checks block factors code by code; octet-mutlo.gz = HEAD
# with the bf16 scaling's `lo` dropped (bf_split, mixed.cu); octet-mutidx.gz = HEAD
# with column block 1 reading block 0's factor in the wgmma kernel). The new case
# must pass on HEAD on every path (bf16 scaling, OCTET_MIXED_BLOCK=f32,
# OCTET_MIXED=upcast) and fail on both mutants.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
R=/tmp/r38e; mkdir -p $R
{
timeout 300 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "HEAD selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a "code times 128x128" $R/selftest.txt | cut -c1-200
for v in "OCTET_MIXED_BLOCK=f32" "OCTET_MIXED=upcast"; do
  env $v OCTET_SELFTEST_ONLY=mixed timeout 300 dev-bin/octet selftest --device cuda > $R/selftest-$v.txt 2>&1
  echo "HEAD $v mixed selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-$v.txt | head -2 | paste -sd' ')"
  grep -a "code times 128x128" $R/selftest-$v.txt | cut -c1-200
done
for mut in mutlo mutidx; do
  OCTET_SELFTEST_ONLY=mixed timeout 300 dev-bin/octet-$mut selftest --device cuda > $R/selftest-$mut.txt 2>&1
  echo "$mut mixed selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -c FAIL $R/selftest-$mut.txt) FAIL lines"
  grep -a FAIL $R/selftest-$mut.txt | head -12 | cut -c1-250
done
cp $R/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
