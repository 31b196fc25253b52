#!/usr/bin/env bash
# Thirty-sixth session, call h ($OUT set; carry dev-bin: octet.gz = HEAD 054ec9e).
# A third reviewer's host-side checks, in the LoRA layers: adapter buffers against
# (n, k, rank), the rank against the saved state, the base against the layer.
# Written without a GPU. As call g: the full selftest runs their cases, then the
# trainer smoke test (LoRA included) and decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r36h; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 400 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -i -E "lora.*(shape error|refused)|adapter" $R/selftest.txt | tr -s ' ' | cut -c1-220
O=$R/runs
(cd $R
$B train --device cuda --model tiny --steps 6 --out-dir $O --name pre > pre.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(tail -2 pre.txt | tr -s ' ' | paste -sd' ' | cut -c1-300)"
CK=$O/pre/checkpoints/$(cat $O/pre/checkpoints/latest)
$B lora --device cuda --base $CK --model tiny --steps 4 --out-dir $O --name ad > lora.txt 2>&1
echo "lora rc=$? ($((SECONDS-t0)) s): $(tail -2 lora.txt | tr -s ' ' | paste -sd' ' | cut -c1-300)"
$B generate --device cuda --checkpoint $CK --prompt "ROMEO:" --max-tokens 40 > gen.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(tail -3 gen.txt | tr -s ' ' | paste -sd' ' | cut -c1-300)"
)
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
cp $R/decode.txt $OUT/
