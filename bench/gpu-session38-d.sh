#!/usr/bin/env bash
# Thirty-eighth session, call d ($OUT set; carry dev-bin: octet.gz = HEAD with the run-directory resolver).
# From a cold start: the full selftest; the weight-only selftest with integer FP8
# conversions (OCTET_FP8_CONVERT=soft); a first training run; LoRA with bf16 compute
# on a block-scaled base; decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r38d; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 300 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed timeout 300 $B selftest --device cuda > $R/selftest-soft.txt 2>&1
echo "soft mixed selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest-soft.txt | head -3)"
grep -a FAIL $R/selftest-soft.txt | head -10 | cut -c1-300
(cd $R; $B train --device cuda --model tiny --steps 20 --out-dir $R/runs --name t > t.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(tail -1 t.txt | cut -c1-200)"
$B lora --device cuda --model tiny --steps 20 --base runs/t --compute bf16 --base-format fp8-block --out-dir $R/runs --name l > l.txt 2>&1
echo "lora bf16 block128 rc=$? ($((SECONDS-t0)) s): $(tail -2 l.txt | cut -c1-200 | paste -sd' ')"
$B generate --device cuda --checkpoint runs/t --adapter runs/l --adapter-base-format fp8-block --weights fp8-block --prompt "The " --max-tokens 32 > g.txt 2>&1
echo "generate run dir + adapter rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'merged|tok/s|error' g.txt | head -3 | cut -c1-160 | paste -sd' ')")
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
cp $R/*.txt $R/runs/*/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
