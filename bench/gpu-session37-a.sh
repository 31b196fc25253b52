#!/usr/bin/env bash
# Thirty-seventh session, call a ($OUT set; carry dev-bin: octet.gz = HEAD after the review patches).
# The review fixes of this session: NVFP4's per-tensor scale rounded once on CPU and
# GPU (the selftest compares it bit for bit), and the GPU model's host-side checks
# with their selftest cases (written without a GPU). The full selftest runs them;
# then the trainer smoke test (an nvfp4 run included), LoRA, generate, decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r37a; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 400 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -i -E "nvfp4.*global|global.*nvfp4" $R/selftest.txt | head -4 | tr -s ' ' | cut -c1-220
O=$R/runs
(cd $R
$B train --device cuda --model tiny --steps 6 --out-dir $O --name pre > pre.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(tail -2 pre.txt | tr -s ' ' | paste -sd' ' | cut -c1-300)"
$B train --device cuda --model tiny --recipe nvfp4 --steps 6 --no-save --out-dir $O --name nv > nv.txt 2>&1
echo "train nvfp4 rc=$? ($((SECONDS-t0)) s): $(tail -2 nv.txt | tr -s ' ' | paste -sd' ' | cut -c1-300)"
# The final sample past the tiny model's 64 positions (the window slides), and a
# resumed run's loss.png against the uninterrupted run's.
$B train --device cuda --model tiny --steps 2 --seq 32 --no-save --out-dir $O --name win > win.txt 2>&1
echo "train sample rc=$? ($((SECONDS-t0)) s): $(grep -a -c . win.txt) lines; $(grep -a -i "sample" win.txt | head -2 | cut -c1-120)"
$B train --device cuda --model tiny --steps 4 --ckpt-every 2 --out-dir $O --name full > full.txt 2>&1
$B train --device cuda --model tiny --steps 4 --ckpt-every 2 --out-dir $O --name res --resume $O/full/checkpoints/step_000002 > res.txt 2>&1
echo "resume rc=$? loss.png md5: full $(md5sum < $O/full/loss.png | cut -c1-12) resumed $(md5sum < $O/res/loss.png | cut -c1-12)"
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
cp $R/decode.txt $R/win.txt $OUT/ 2>/dev/null; cp $R/runs/full/loss.png $OUT/full-loss.png; cp $R/runs/res/loss.png $OUT/res-loss.png
