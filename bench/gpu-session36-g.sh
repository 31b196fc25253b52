#!/usr/bin/env bash
# Thirty-sixth session, call g ($OUT set; carry dev-bin: octet.gz = HEAD 0708e25).
# A second reviewer's host-side checks (relabelled DeviceFp8Weight, out buffers of
# the row-wise and 1x128 quantizers, transpose grid limits, NVFP4 u32 counts, empty
# amax buffers, a GpuDecoder whose cfg changed), written without a GPU. As call e:
# the full selftest runs their cases; the trainer smoke test; decode speed (the
# weight check now runs on every weight-only product).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r36g; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 400 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -E "relabel|changed|grid|k changed|scaling changed" $R/selftest.txt | tr -s ' ' | cut -c1-220
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
