#!/usr/bin/env bash
# Thirtieth session, call e ($OUT set; carry dev-bin: octet.gz = sampling on
# the device, and an experiment switch OCTET_ATTEND naming the attention
# kernel: attend_decode (HEAD's), attend_online (call d's: per-warp softmax
# state, keys and values loaded together; 117 registers, two blocks an SM,
# so the 272 blocks of the ~1B model need 2 waves), attend_online_u2 (two
# positions in flight a warp, 76 registers, three blocks an SM) and
# attend_online_lb3 (four in flight, capped at 80 registers, spills).
# The full selftest under attend_online_u2; decode of the ~1B model (FP8,
# 256 tokens, greedy) under each kernel, two rounds in turn; 1800 tokens
# under attend_decode and attend_online_u2.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
OCTET_ATTEND=attend_online_u2 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest (u2) rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
grep -a "decode small model, fp8.*SQNR" $R/selftest.txt | sed 's/   */ /g'
G="generate --random-model 1b --device cuda --weights fp8 --temperature 0"
for rep in 1 2; do
  for k in attend_decode attend_online attend_online_u2 attend_online_lb3; do
    OCTET_ATTEND=$k dev-bin/octet $G --max-tokens 256 > $R/g.txt 2>&1
    echo "$k rep $rep rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/g.txt | tail -1)"
  done
done
for k in attend_decode attend_online_u2; do
  [ $SECONDS -gt 530 ] && break
  OCTET_ATTEND=$k dev-bin/octet $G --max-tokens 1800 > $R/l.txt 2>&1
  echo "1800 tokens $k rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/l.txt | tail -1)"
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
