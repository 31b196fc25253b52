#!/usr/bin/env bash
# Thirty-first session, call e ($OUT set; carry dev-bin: octet.gz = the review
# commit: the selftest's refused-shape cases through shape_error and
# small_fp8_weight). The full selftest; decode once (FP8 beside bf16, greedy).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head
grep -a "shape error" $R/selftest.txt | sed 's/   */ /g' | cut -c1-120
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g.txt 2>&1
echo "greedy rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g.txt) text $(text_md5 $R/g.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
