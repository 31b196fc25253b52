#!/usr/bin/env bash
# Twenty-second session, tenth call ($OUT set; carry dev-bin = HEAD): for a
# later session, where the d_A kernel stalls, by SASS instruction: ncu's
# SourceCounters and WarpStateStats on one launch of lora_da_e4m3_mt1 (the
# down projection's, K = 5632) in a one-step ~1B LoRA run (FP8 base,
# quantized backward, FP8 saved activations), then the source page as CSV.
set -uo pipefail
t0=$SECONDS
mkdir -p /tmp/r
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
timeout 240 /usr/local/cuda/bin/ncu --clock-control none -k regex:lora_da_e4m3_mt1 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --section SpeedOfLight -o /tmp/r/rep-da \
  dev-bin/octet lora --device cuda --model 1b --batch 4 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
  --no-save $fp8 --out-dir /tmp/runs --name n-da > /tmp/r/ncu-da.log 2>&1
echo "== rc=$? ($((SECONDS-t0)) s)"
/usr/local/cuda/bin/ncu --import /tmp/r/rep-da.ncu-rep --page source --print-source sass --csv > /tmp/r/sass-da.csv 2> /tmp/r/sass-da.err
echo "source page rc=$? lines $(wc -l < /tmp/r/sass-da.csv)"; head -c 600 /tmp/r/sass-da.err
/usr/local/cuda/bin/ncu --import /tmp/r/rep-da.ncu-rep --page details --csv > /tmp/r/details-da.csv 2>&1
gzip -f /tmp/r/*.csv
rm -f /tmp/r/rep-da.ncu-rep
tar czf $OUT/results.tgz -C /tmp/r .
echo "done ($((SECONDS-t0)) s)"
