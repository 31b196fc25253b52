#!/usr/bin/env bash
# Twenty-eighth session, call h ($OUT set; carry dev-bin: octet = call g's
# build with its selftest fixed: the prefill case had shadowed the logits
# the graph-vs-eager case compares against). The full selftest only.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)" | tee $R/summary.txt
grep -a "decode .* model\|FAIL" $R/selftest.txt | sed 's/   */ /g' | tee -a $R/summary.txt
