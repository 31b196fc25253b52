#!/usr/bin/env bash
# Thirty-seventh session, call f ($OUT set; carry dev-bin: octet-c.gz = 74bb70d (PTX
# cached, every module assembled again by the driver at load), octet.gz = 518b7d4
# (CUBIN compiled by NVRTC for sm_90a and cached; no JIT at load)). As call e: a first
# GPU training run on its own empty kernel cache, new, old, new, old, timed whole,
# with the -v trace. Then the full selftest of the new binary, the weight-only
# selftest under OCTET_FP8_CONVERT=soft (another set of modules), and decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
R=/tmp/r37f; mkdir -p $R
D=$PWD/dev-bin
{
for round in 1 2; do
for b in octet octet-c; do
  export OCTET_CACHE=$R/cache-$b-$round; rm -rf $OCTET_CACHE
  s=$(date +%s.%N)
  $D/$b train --device cuda --model tiny --steps 3 --no-save -v --out-dir $R/runs --name $b-$round > $R/$b-$round.txt 2> $R/$b-$round.err
  rc=$?; e=$(date +%s.%N)
  slow=$(grep -a 'kernel module' $R/$b-$round.err | sed 's/.*module="\([a-z0-9_.]*\)".*ms=\([0-9]*\).*/\2 \1/' | sort -n | tail -3 | awk '{printf "%s %.1fs, ", $2, $1/1000}')
  first_step=$(grep -a -m1 'step=1' $R/$b-$round.err | awk '{print $1}')
  echo "round $round $b: rc=$rc whole $(awk "BEGIN{printf \"%.1f\", $e-$s}") s; step 1 at ${first_step}; slowest compiles: $slow"
done
done
unset OCTET_CACHE
timeout 400 $D/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed timeout 300 $D/octet selftest --device cuda > $R/soft.txt 2>&1
echo "soft weight-only selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/soft.txt | head -3)"
. bench/session12_runs.sh
timeout 200 $D/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
cp $R/*.err $OUT/ 2>/dev/null

