#!/usr/bin/env bash
# Thirty-third session, call b ($OUT set; carry dev-bin: the call-a binary).
# Call a's summary did not come back (too many files under $OUT); its bench
# and selftest part again, the raw files kept in /tmp and only the summary
# returned. Variants as in call a (gpu-session33-a.sh).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r33b; mkdir -p $R
{
OCTET_MIXED_EXP=direct,step2,mixconv OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=direct,step2,mixconv rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2; do
  for v in table direct step2 mixconv soft direct-mixconv; do
    case $v in
      table) e="X=1";;
      direct) e="OCTET_MIXED_EXP=direct";;
      step2) e="OCTET_MIXED_EXP=step2";;
      mixconv) e="OCTET_MIXED_EXP=mixconv";;
      soft) e="OCTET_FP8_CONVERT=soft";;
      direct-mixconv) e="OCTET_MIXED_EXP=direct,mixconv";;
    esac
    env $e dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
