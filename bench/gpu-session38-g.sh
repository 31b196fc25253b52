#!/usr/bin/env bash
# Thirty-eighth session, call g ($OUT set; carry dev-bin: octet.gz = HEAD with the
# 128x128 quantizer's buffer checks and the selftest cases for them; also the
# learning-rate schedule that ends at --min-lr). The full selftest from a cold start;
# a short GPU training run with its learning rates; decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r38g; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 300 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a "128x128 quantize into" $R/selftest.txt | cut -c1-160
(cd $R; $B train --device cuda --model tiny --steps 6 --warmup 1 --lr 1e-2 --min-lr 1e-3 --out-dir runs --name t > t.txt 2>&1
echo "train rc=$?: lr by step: $(grep -o '"lr":[^,]*' runs/t/metrics.jsonl | cut -d: -f2 | paste -sd' ')")
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
cp $R/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
