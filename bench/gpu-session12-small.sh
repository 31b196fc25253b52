#!/usr/bin/env bash
# Twelfth session: the default small model's GPU speed, new binary against the
# session's starting one, alternated in one call (the small model is bound by
# kernel launches and the host, so one run of each is not enough to compare).
# Run on the lent GPU with $OUT set (carry dev-bin).
set -uo pipefail
for i in 1 2 3; do
  for b in old new; do
    bin=dev-bin/octet; [ $b = old ] && bin=dev-bin/octet-old
    for r in bf16 tensorwise; do
      $bin train --device cuda --recipe $r --sample-tokens 0 --no-save --out-dir /tmp/runs --name s-$b-$r-$i > /tmp/s.txt 2>&1 || tail -3 /tmp/s.txt
      echo "$b $r run $i: $(python3 bench/metrics_summary.py /tmp/runs/s-$b-$r-$i/metrics.jsonl 1024 3 | sed 's/;.*//')"
    done
  done
done
