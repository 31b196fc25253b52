#!/usr/bin/env bash
# Thirty-seventh session, call d ($OUT set; carry dev-bin: octet-c.gz = 74bb70d (call
# c's binary: the modules loaded at open compiled on threads), octet.gz = 16a86e2
# (every module compiled at open on a pool, the ones loaded later into the cache).
# Each binary runs a first GPU training run and a first LoRA run on its own empty
# kernel cache (OCTET_CACHE), timed whole, then the same again on the warm cache.
# Then the full selftest of the new binary, and decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r37d; mkdir -p $R
cd $R
{
for b in octet-c octet; do
  B=/work/dev-bin/$b; [ -x "$B" ] || B=$OLDPWD/dev-bin/$b
  export OCTET_CACHE=$R/cache-$b; rm -rf $OCTET_CACHE
  for pass in cold warm; do
    s=$(date +%s.%N)
    $B train --device cuda --model tiny --steps 3 --out-dir $R/runs-$b --name t-$pass > $R/$b-train-$pass.txt 2> $R/$b-train-$pass.err
    rc=$?; e=$(date +%s.%N)
    CK=$R/runs-$b/t-$pass/checkpoints/$(cat $R/runs-$b/t-$pass/checkpoints/latest 2>/dev/null)
    s2=$(date +%s.%N)
    $B lora --device cuda --base $CK --model tiny --steps 2 --no-save --out-dir $R/runs-$b --name l-$pass > $R/$b-lora-$pass.txt 2>&1
    rc2=$?; e2=$(date +%s.%N)
    echo "$b $pass: train rc=$rc $(awk "BEGIN{printf \"%.1f\", $e-$s}") s; lora rc=$rc2 $(awk "BEGIN{printf \"%.1f\", $e2-$s2}") s; cache $(ls $OCTET_CACHE | wc -l) files; announced: $(grep -a -c 'compiling CUDA kernels' $R/$b-train-$pass.err)"
  done
done
unset OCTET_CACHE
B=$OLDPWD/dev-bin/octet
timeout 400 $B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
head -20 $R/octet-train-cold.err > $OUT/announce.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
