#!/usr/bin/env bash
# Thirty-seventh session, call b ($OUT set; carry dev-bin: octet.gz = HEAD 6b4c1ab).
# The full selftest with the decoder's new weight checks (written without a GPU),
# traced with -v (kernel modules compiled or read from the cache, on stderr); a
# traced GPU training run; the trainer smoke test; decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r37b; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 400 $B selftest --device cuda -v > $R/selftest.txt 2> $R/selftest-trace.txt
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -E "weights unlike the config" $R/selftest.txt | tr -s ' ' | cut -c1-200
echo "trace: $(grep -a -c 'kernel module' $R/selftest-trace.txt) kernel-module lines; first: $(grep -a -m1 'opening the GPU' $R/selftest-trace.txt | cut -c1-200)"
grep -a -m3 'kernel module' $R/selftest-trace.txt | cut -c1-200
O=$R/runs
(cd $R
$B train --device cuda --model tiny --steps 3 -v --out-dir $O --name tr > tr.txt 2> tr-trace.txt
echo "train -v rc=$? ($((SECONDS-t0)) s): $(grep -a -c 'step=' tr-trace.txt) step lines; $(grep -a 'checkpoint written' tr-trace.txt | cut -c1-160)"
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
gzip -c $R/selftest-trace.txt > $OUT/selftest-trace.txt.gz
cp $R/decode.txt $R/tr-trace.txt $OUT/ 2>/dev/null
