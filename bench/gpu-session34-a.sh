#!/usr/bin/env bash
# Thirty-fourth session, call a ($OUT set; carry dev-bin: octet.gz = 3e8a492
# plus an uncommitted OCTET_MIXED_EXP hook, which puts #define OCTET_EXP_<X>
# in front of mixed.cu). The open cell: bf16 x, 4096x4096, 12-16 tokens at
# 0.78-0.82 of copy. Variants of the 16-token kernel's copies:
#   STEPX - stepped x copies for two token groups, codes per piece
#           (bf16 loop 390 -> 325 SASS, f16 325 -> 264)
#   STEP2 - stepped x and code copies (bf16 298, f16 236); in sessions 32
#           and 33 it lost 0.04-0.08 on 4096x14336: is that the PDL overlap?
# Weight-only selftest under STEPX, three rounds of bench mixed at 12/16
# tokens with and without PDL, then ncu on 4096x14336 (base, STEP2).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r34a; mkdir -p $R
{
OCTET_MIXED_EXP=STEPX OCTET_SELFTEST_ONLY=mixed timeout 200 dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=STEPX rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2 3; do
  for v in base stepx step2 base-nopdl step2-nopdl; do
    case $v in
      base) e="X=1";;
      stepx) e="OCTET_MIXED_EXP=STEPX";;
      step2) e="OCTET_MIXED_EXP=STEP2";;
      base-nopdl) e="OCTET_MIXED_PDL=0";;
      step2-nopdl) e="OCTET_MIXED_EXP=STEP2 OCTET_MIXED_PDL=0";;
    esac
    env $e timeout 120 dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
NCU=/usr/local/cuda/bin/ncu
prof() { # name env kernel-regex
  local n=$1 e=$2 k=$3
  env $e timeout 100 $NCU --set full --import-source no -k "regex:$k" --launch-skip 3 --launch-count 1 -o $R/ncu-$n \
    dev-bin/octet bench mixed --device cuda --m 16 --kn 4096x14336 > $R/ncu-$n.log 2>&1
  echo "== ncu $n rc=$? ($((SECONDS-t0)) s)"
  $NCU --import $R/ncu-$n.ncu-rep --page raw --csv > $R/raw-$n.csv 2>/dev/null
  python3 - $R/raw-$n.csv <<'PY'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
if len(rows) < 3: print("no rows"); sys.exit()
h, u, v = rows[0], rows[1], rows[2]
want = ["gpu__time_duration.sum", "dram__throughput.avg.pct_of_peak_sustained_elapsed",
        "lts__throughput.avg.pct_of_peak_sustained_elapsed", "lts__t_sector_hit_rate.pct", "sm__inst_executed.sum",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "sm__warps_active.avg.pct_of_peak_sustained_active",
        "launch__registers_per_thread", "launch__occupancy_limit_shared_mem", "launch__occupancy_limit_registers",
        "dram__bytes_read.sum", "lts__t_bytes.sum"]
for i, name in enumerate(h):
    if name in want or (name.startswith("smsp__average_warp") and "issue_stalled" in name and name.endswith("ratio")):
        try:
            if float(v[i].replace(',', '')) < 0.05: continue
        except Exception: pass
        print(f"  {name} = {v[i]} {u[i]}")
PY
}
if [ $((SECONDS-t0)) -lt 380 ]; then
  prof base X=1 '^mixed_e4m3_n16_(bf16|f32)t$'
  prof step2 OCTET_MIXED_EXP=STEP2 '^mixed_e4m3_n16_(bf16|f32)t$'
fi
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
gzip -f $R/raw-*.csv 2>/dev/null; cp $R/raw-*.csv.gz $OUT/ 2>/dev/null; true
