#!/usr/bin/env bash
# Thirty-eighth session, call f ($OUT set; carry dev-bin: octet.gz = HEAD after the
# reviews' fixes). From a cold start: the full selftest; the GPU LoRA trainer writes
# octet_lora.json, a resume keeps it, a resume with another --base-format is refused,
# generate merges with the recorded base format; a resume without --name stays in
# its run directory; decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
. bench/session12_runs.sh
R=/tmp/r38f; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 300 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
cd $R
$B train --device cuda --model tiny --steps 10 --out-dir runs --name t > t.txt 2>&1
echo "train rc=$? ($((SECONDS-t0)) s): $(tail -1 t.txt | cut -c1-150)"
$B train --device cuda --model tiny --steps 14 --resume runs/t > t2.txt 2>&1
echo "train --resume runs/t rc=$?: $(grep -a -E 'resumed|checkpoint' t2.txt | tail -2 | cut -c1-150 | paste -sd' '); runs/t latest: $(cat runs/t/checkpoints/latest); runs/default exists: $(test -d runs/default && echo yes || echo no)"
$B lora --device cuda --steps 6 --base runs/t --compute bf16 --base-format fp8-block --out-dir runs --name l > l.txt 2>&1
echo "lora rc=$?: $(grep -a 'octet lora:' l.txt | cut -c1-120); record: $(tr -d ' \n' < runs/l/checkpoints/step_000006/octet_lora.json)"
$B lora --device cuda --steps 8 --resume runs/l > l2.txt 2>&1
echo "lora --resume rc=$?: $(grep -a -E 'octet lora:' l2.txt | cut -c1-120); latest: $(cat runs/l/checkpoints/latest)"
$B lora --device cuda --steps 10 --resume runs/l --base-format fp8-tensorwise > l3.txt 2>&1
echo "lora --resume other format rc=$?: $(grep -a error l3.txt | cut -c1-200)"
$B generate --device cuda --checkpoint runs/t --adapter runs/l --prompt "The " --max-tokens 16 > g.txt 2>&1
echo "generate rc=$?: $(grep -a merged g.txt | cut -c1-200)"
cd - > /dev/null
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
cp $R/*.txt $OUT/ 2>/dev/null
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
