#!/usr/bin/env bash
# Forty-second session, call b, one H200 (carry dev-bin: call a's binary).
# Where the 16-token few-block kernel (n16r2w8) spends its time on 4096x4096
# against the 8-token one: ncu stall reasons per issued instruction, one launch
# each (bf16 x, tiled codes; f16 x beside), and the SASS source page of the
# 16-token kernel with its stall samples.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
R=/tmp/r42b; mkdir -p $R
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
prof() {  # NAME KERNEL-REGEX M
  timeout 100 /usr/local/cuda/bin/ncu --clock-control none --cache-control none --kernel-name "regex:$2" \
    --launch-skip 5 --launch-count 1 --csv --metrics "$M" \
    dev-bin/octet bench mixed --device cuda --m $3 --kn 4096x4096 > $R/ncu-$1.csv 2>&1
  echo "== $1 rc=$? ($((SECONDS-t0)) s): $(python3 bench/ncu_stalls.py $R/ncu-$1.csv)"
}
{
prof m8 '^mixed_e4m3_n8_bf16t$' 8
prof m16 '^mixed_e4m3_n16r2w8_bf16t$' 16
prof m16f16 '^mixed_e4m3_n16r2w8_xf16_bf16t$' 16
timeout 100 /usr/local/cuda/bin/ncu --clock-control none --kernel-name 'regex:^mixed_e4m3_n16r2w8_bf16t$' --launch-skip 5 --launch-count 1 \
  --section SourceCounters --section WarpStateStats -o $R/rep-m16 dev-bin/octet bench mixed --device cuda --m 16 --kn 4096x4096 > $R/ncu-src.log 2>&1
echo "== source rc=$? ($((SECONDS-t0)) s)"
/usr/local/cuda/bin/ncu --import $R/rep-m16.ncu-rep --page source --print-source sass --csv > $R/sass-m16.csv 2> $R/sass-m16.err
echo "source page rc=$? lines $(wc -l < $R/sass-m16.csv)"
/usr/local/cuda/bin/ncu --import $R/rep-m16.ncu-rep --page details --csv > $R/details-m16.csv 2>&1
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
rm -f $R/*.ncu-rep; gzip -f $R/*.csv
tar czf $OUT/raw.tgz -C $R .
