#!/usr/bin/env bash
# Thirty-seventh session, call i ($OUT set; carry dev-bin: octet.gz = HEAD after the
# review mend of the NVRTC build routine). Cold start: the full selftest, a first
# training run, decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r37i; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 400 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
echo "cache: $(ls ~/.cache/octet/kernels | sed 's/-.*\././' | sort | uniq -c | tr -s ' ' | paste -sd' ')"
(cd $R; $B train --device cuda --model tiny --steps 4 --no-save --out-dir $R/runs --name t > t.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(tail -1 t.txt | cut -c1-200)")
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
