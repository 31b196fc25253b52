#!/usr/bin/env bash
# Thirty-fifth session, call d ($OUT set; carry dev-bin: octet.gz = 360da6b
# plus device sampling that refuses a row with an inf or NaN logit
# (decode.cu sample_token writes -1; GpuDecoder::generate stops with an
# error naming the step), uncommitted). The full selftest (new case: a NaN,
# +inf or -inf logit is refused), then the decode comparison of the last
# stops: same text (md5 002ac2454685) and tokens/s.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r35d; mkdir -p $R
{
timeout 400 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -10
grep -a "logit is refused" $R/selftest.txt | cut -c1-200
timeout 150 dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/gen.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/gen.txt) text md5 $(text_md5 $R/gen.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -c $R/selftest.txt > $OUT/selftest.txt.gz
cp $R/gen.txt $OUT/
