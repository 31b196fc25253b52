#!/usr/bin/env bash
# Thirty-seventh session, call g ($OUT set; carry dev-bin: octet.gz = HEAD, see summary).
# HEAD after the review mend that shares the telemetry line between trainers: the
# full selftest, a GPU run writing telemetry every 2 steps (config file), then the
# trainer smoke test and decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r37g; mkdir -p $R
B=$PWD/dev-bin/octet
{
timeout 400 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
O=$R/runs
(cd $R
printf 'telemetry_every = 2\n' > tel.toml
$B train --device cuda --model tiny --steps 4 --config tel.toml --no-save --out-dir $O --name tel > tel.txt 2>&1
echo "train telemetry rc=$?: $(grep -c '"telemetry"' $O/tel/metrics.jsonl) telemetry lines at steps $(grep '"telemetry"' $O/tel/metrics.jsonl | python3 -c 'import sys,json; print([json.loads(l)["step"] for l in sys.stdin])'); first layer: $(grep -m1 '"telemetry"' $O/tel/metrics.jsonl | python3 -c 'import sys,json; print(json.loads(sys.stdin.readline())["telemetry"][0])')"
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
cp $R/decode.txt $OUT/
