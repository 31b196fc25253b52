#!/usr/bin/env bash
# Nineteenth session ($OUT set; carry dev-bin): for a later session, the
# stall sampling of the small-M weight-only kernel by SASS instruction, the
# measurement the seventeenth session named next (NOTES.md): ncu's
# SourceCounters and WarpStateStats on one launch of the 8-token (n8) and
# the 16-token (n16) kernel on 8192x28672, then the source page as CSV.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
for k in n8 n16; do
  timeout 200 /usr/local/cuda/bin/ncu --clock-control none -k regex:mixed_e4m3_${k}_bf16 --launch-skip 10 --launch-count 1 \
    --section SourceCounters --section WarpStateStats -o /tmp/r/rep-$k \
    dev-bin/octet bench mixed --device cuda --m 8,16 --kn 8192x28672 > /tmp/r/ncu-$k.log 2>&1
  echo "== $k rc=$? ($((SECONDS-t0)) s)"
  /usr/local/cuda/bin/ncu --import /tmp/r/rep-$k.ncu-rep --page source --print-source sass --csv > /tmp/r/sass-$k.csv 2> /tmp/r/sass-$k.err
  echo "source page rc=$? lines $(wc -l < /tmp/r/sass-$k.csv)"; head -c 600 /tmp/r/sass-$k.err
  /usr/local/cuda/bin/ncu --import /tmp/r/rep-$k.ncu-rep --page details --csv > /tmp/r/details-$k.csv 2>&1
done
gzip -f /tmp/r/*.csv
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
