#!/usr/bin/env bash
# Thirty-sixth session, call i ($OUT set; carry dev-bin: octet.gz = HEAD 4fc6e51).
# `octet generate` now prints through a stream that holds back an unfinished UTF-8
# character (GPU and CPU paths). A GPU smoke test of generate: a tiny model
# pretrained on the GPU, then generate from it, and the 1b random model's FP8
# against bf16 decode (its printed text and speed).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r36i; mkdir -p $R
B=$PWD/dev-bin/octet
{
(cd $R
$B train --device cuda --model tiny --steps 20 --out-dir runs --name pre > pre.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(tail -1 pre.txt | cut -c1-200)"
CK=runs/pre/checkpoints/$(cat runs/pre/checkpoints/latest)
$B generate --device cuda --checkpoint $CK --prompt "ROMEO:" --max-tokens 60 --temperature 0 > gen.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(head -c 300 gen.txt | tr '\n' ' ')"
$B generate --device cpu --checkpoint $CK --prompt "ROMEO:" --max-tokens 60 --temperature 0 --weights f32 > gen-cpu.txt 2>&1
echo "generate cpu rc=$? : $(head -c 200 gen-cpu.txt | tr '\n' ' ')"
)
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "text md5 $(head -1 $R/decode.txt | md5sum | cut -c1-12)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
cp $R/decode.txt $R/gen.txt $OUT/ 2>/dev/null
