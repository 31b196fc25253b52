#!/usr/bin/env bash
# Thirty-third session, call a ($OUT set; carry dev-bin: octet.gz = 863da3e
# plus an uncommitted OCTET_MIXED_EXP hook, which puts #define OCTET_EXP_<X>
# in front of mixed.cu). The open cell: bf16 x, 4096x4096, 12-16 tokens at
# 0.77 of copy (f16 x 0.85-0.86). Variants of the 16-token kernel:
#   direct  - no per-block accumulator for tensor / row scales (the loop
#             without the zeroing and the FMA by 1; 390 -> 371 SASS)
#   step2   - stepped copies for two token groups (390 -> 291)
#   mixconv - half the pairs by the integer E4M3 -> bf16 path (other pipes)
#   soft    - every pair by the integer path (OCTET_FP8_CONVERT=soft)
# The weight-only selftest under all three EXP defines, two rounds of bench
# mixed at 12/16 tokens on 4096x4096 and 4096x14336, then ncu --set full on
# one launch of the bf16 n16 kernel (table and direct,step2) and the f16 one.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
OCTET_MIXED_EXP=direct,step2,mixconv OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=direct,step2,mixconv rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2; do
  for v in table direct step2 direct-step2 mixconv soft direct-step2-w6; do
    case $v in
      table) e="X=1";;
      direct) e="OCTET_MIXED_EXP=direct";;
      step2) e="OCTET_MIXED_EXP=step2";;
      direct-step2) e="OCTET_MIXED_EXP=direct,step2";;
      mixconv) e="OCTET_MIXED_EXP=mixconv";;
      soft) e="OCTET_FP8_CONVERT=soft";;
      direct-step2-w6) e="OCTET_MIXED_EXP=direct,step2 OCTET_MIXED_TUNE=2:6:3";;
    esac
    env $e dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
NCU=/usr/local/cuda/bin/ncu
prof() { # name env kernel-regex
  local n=$1 e=$2 k=$3
  env $e timeout 150 $NCU --set full --import-source no -k "regex:$k" --launch-skip 3 --launch-count 1 -o $R/ncu-$n \
    dev-bin/octet bench mixed --device cuda --m 16 --kn 4096x4096 > $R/ncu-$n.log 2>&1
  echo "== ncu $n rc=$? ($((SECONDS-t0)) s)"
  $NCU --import $R/ncu-$n.ncu-rep --page raw --csv > $R/raw-$n.csv 2>/dev/null
  $NCU --import $R/ncu-$n.ncu-rep --page details --csv > $R/details-$n.csv 2>/dev/null
  python3 - $R/raw-$n.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: print("no rows"); sys.exit()
h, u, v = rows[0], rows[1], rows[2]
want = ["Kernel Name", "gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed", "sm__inst_executed.sum", "smsp__issue_active.avg.pct_of_peak_sustained_active",
        "sm__warps_active.avg.pct_of_peak_sustained_active", "launch__registers_per_thread", "launch__occupancy_limit_shared_mem"]
for i, name in enumerate(h):
    if name in want or ("inst_executed_pipe_" in name and name.endswith("pct_of_peak_sustained_active")) or \
       (name.startswith("smsp__average_warp") and "issue_stalled" in name and name.endswith("ratio")) or \
       name.startswith("smsp__pcsamp_warps_issue_stalled_") and not name.endswith("not_issued"):
        try:
            if v[i] in ("", "0") or (v[i].replace('.', '', 1).isdigit() and float(v[i]) < 0.05): continue
        except Exception: pass
        print(f"  {name} = {v[i]} {u[i]}")
PY
}
prof bf16-table X=1 '^mixed_e4m3_n16_(bf16|f32)t$'
prof bf16-direct-step2 OCTET_MIXED_EXP=direct,step2 '^mixed_e4m3_n16_(bf16|f32)t$'
prof f16-table X=1 '^mixed_e4m3_n16w6_xf16_(bf16|f32)t$'
gzip -f $R/*.csv
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
