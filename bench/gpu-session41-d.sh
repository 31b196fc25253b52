#!/usr/bin/env bash
# Forty-first session, call d, one H200 (carry dev-bin: octet.gz = HEAD with the
# CLI review's fixes). The GPU trainer's paths through them: a run, a second run
# into its directory (refused), a resume from the recorded settings alone, LoRA
# on the run, generation from it. No kernel changed since call c.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
B=$PWD/dev-bin/octet
cd /tmp
{
$B train --device cuda --model tiny --steps 20 --name g > g1.txt 2>&1; echo "train rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'tokens/s|wrote' g1.txt | tail -2 | tr '\n' ' ')"
$B train --device cuda --model tiny --steps 20 --name g > g2.txt 2>&1; echo "again rc=$?: $(tail -1 g2.txt)"
$B train --device cuda --resume runs/g --steps 30 > g3.txt 2>&1; echo "resume rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'resumed|warning|wrote' g3.txt | tail -3 | tr '\n' ' ')"
$B lora --device cuda --base runs/g --steps 10 --name gl > g4.txt 2>&1; echo "lora rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'octet lora:|wrote' g4.txt | tr '\n' ' ')"
$B generate --device cuda --checkpoint runs/g --prompt "ROMEO:" --max-tokens 32 --temperature 0 > g5.txt 2>&1; echo "generate rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' g5.txt | tail -1)"
$B generate --device cuda --checkpoint runs/gl --prompt "ROMEO:" > g6.txt 2>&1; echo "generate on adapter rc=$?: $(tail -1 g6.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
