#!/usr/bin/env bash
# Twenty-ninth session, call f ($OUT set; carry dev-bin: octet-old = 42f8c88;
# octet = call e's kernel, reads through stepped generic pointers, same SASS).
# Call e: the new small-M kernel reads 0.83 of copy on 4096x14336 at 8 tokens
# against 0.87 (and decode 1297 against 1326 tok/s) with fewer instructions.
# ncu on one launch each (the sixth), 4096x14336: warp stall reasons,
# instructions, DRAM throughput; old / new at M = 1, 8, 16, and new with
# 8 warps at 16 tokens (OCTET_MIXED_TUNE=2:8:2).
set -uo pipefail
t0=$SECONDS
R=$OUT/r; mkdir -p $R
M="gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum,sm__warps_active.avg.per_cycle_active,smsp__issue_active.avg.per_cycle_active,regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio"
prof() {  # NAME BIN M [env...]
  local name=$1 bin=$2 m=$3; shift 3
  env "$@" timeout 200 ncu --clock-control none --cache-control none --kernel-name regex:mixed_e4m3_ \
    --launch-skip 5 --launch-count 1 --csv --metrics "$M" \
    dev-bin/$bin bench mixed --device cuda --m $m --kn 4096x14336 > $R/ncu-$name.csv 2>&1
  echo "== $name rc=$? ($((SECONDS-t0)) s): $(python3 bench/ncu_stalls.py $R/ncu-$name.csv)"
}
{
prof old-m1 octet-old 1
prof new-m1 octet 1
prof old-m8 octet-old 8
prof new-m8 octet 8
prof old-m16 octet-old 16
prof new-m16 octet 16
prof new-m16-w8 octet 16 OCTET_MIXED_TUNE=2:8:2
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
