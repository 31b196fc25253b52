#!/usr/bin/env bash
# Twenty-ninth session, call l ($OUT set; carry dev-bin: octet-old = de0835f;
# octet = the review: `prefill` queues its 256-row pieces back to back and
# downloads only the last piece's logits). The full selftest, then a
# 700-token prompt (three pieces) at temperature 0, old and new: same text.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
P=$(python3 -c "print(('the quick brown fox jumps over the lazy dog. ' * 16)[:700])")
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
for bin in octet-old octet; do
  dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --max-tokens 64 --temperature 0 \
    --prompt "$P" > $R/long-$bin.txt 2>&1
  echo "long prompt $bin rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/long-$bin.txt | tail -1)"
done
# The sampled text: the lines before the table.
for bin in octet-old octet; do sed -n '/^weights/q;p' $R/long-$bin.txt | sed 1,2d | md5sum | sed "s/-/text $bin/"; done
cmp -s <(sed -n '/^weights/q;p' $R/long-octet-old.txt) <(sed -n '/^weights/q;p' $R/long-octet.txt) && echo "same text" || echo "texts differ"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
