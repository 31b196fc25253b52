#!/usr/bin/env bash
# Thirty-seventh session, call c ($OUT set; carry dev-bin: octet.gz = HEAD, see summary).
# The weight-only module now compiles in three parts on threads with quantize and
# block_quantize when the GPU is opened. On this fresh machine (cold kernel cache)
# the -v trace times the open; call b's binary compiled them one after another
# (mixed alone 30.0 s, done 38.7 s after start). Then the full selftest, the tuning
# shape (built in part 0), the small-M bench and decode speed.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r37c; mkdir -p $R
B=$PWD/dev-bin/octet
{
echo "kernel cache before: $(ls ~/.cache/octet/kernels 2>/dev/null | wc -l) files"
timeout 400 $B selftest --device cuda -v > $R/selftest.txt 2> $R/selftest-trace.txt
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $R/selftest.txt | head -3)"
grep -a FAIL $R/selftest.txt | head -10 | cut -c1-300
grep -a -E "opening the GPU|kernel module" $R/selftest-trace.txt | head -6 | cut -c1-190
timeout 120 env OCTET_MIXED_TUNE=2:6:3 $B bench mixed --device cuda --m 16 --kn 4096x4096 > $R/tune.txt 2>&1
echo "tune rc=$?: $(grep -a -i -E 'tune|16' $R/tune.txt | head -4 | tr -s ' ' | cut -c1-200)"
timeout 300 $B bench mixed --device cuda --m 1,4,16 --kn 4096x4096,8192x28672 > $R/mixed.txt 2>&1
echo "bench mixed rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $R/mixed.txt copy)"
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
cp $R/selftest-trace.txt $R/tune.txt $R/mixed.txt $R/decode.txt $OUT/ 2>/dev/null
