#!/usr/bin/env bash
# Thirty-fifth session, call e ($OUT set; carry dev-bin: octet.gz = 0bd46d8,
# the review's trainer fixes: atomic checkpoint swap, strict config keys,
# LoRA resume checks). A GPU smoke test of the trainer paths they touch:
# pretrain a tiny model, LoRA on it, resume the LoRA (same settings: must
# run; another alpha: must be refused), and `octet generate` from the
# pretrain checkpoint.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
R=/tmp/r35e; mkdir -p $R; cd $R
O=/tmp/r35e/runs
B=$OLDPWD/dev-bin/octet
{
$B train --device cuda --model tiny --steps 6 --out-dir $O --name pre > pre.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(grep -a -iE 'step +6|saved|checkpoint' pre.txt | tail -2 | tr -s ' ')"
ls $O/pre/checkpoints
CK=$O/pre/checkpoints/$(cat $O/pre/checkpoints/latest)
$B lora --device cuda --base $CK --model tiny --steps 4 --out-dir $O --name ad > lora.txt 2>&1
echo "lora rc=$? ($((SECONDS-t0)) s): $(tail -2 lora.txt | tr -s ' ')"
LK=$O/ad/checkpoints/$(cat $O/ad/checkpoints/latest)
grep -o '"base_model_name_or_path":[^,]*' $LK/adapter_config.json
$B lora --device cuda --resume $LK --model tiny --steps 6 --out-dir $O --name ad > resume.txt 2>&1
echo "lora resume rc=$? ($((SECONDS-t0)) s): $(tail -2 resume.txt | tr -s ' ')"
$B lora --device cuda --resume $LK --alpha 1000 --model tiny --steps 6 --out-dir $O --name ad2 > resume-bad.txt 2>&1
echo "lora resume --alpha 1000 rc=$? (want non-zero): $(tail -1 resume-bad.txt)"
$B generate --device cuda --checkpoint $CK --prompt "ROMEO:" --max-tokens 40 > gen.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(tail -3 gen.txt | tr -s ' ' | paste -sd' ')"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
