# Sourced by the twelfth session's GPU scripts: one ~1B run and its summary line.
#   run1b BIN train|lora NAME BATCH STEPS FIRST_STEP [octet flags...]
# runs `BIN train|lora --device cuda --model 1b --batch BATCH --seq 2048 --steps STEPS`
# without evaluation, samples or checkpoints, then prints bench/metrics_summary.py's
# line for steps FIRST_STEP on.
run1b() {
  local bin=$1 cmd=$2 name=$3 batch=$4 steps=$5 first=$6
  shift 6
  echo "-- $bin $cmd 1b batch $batch: $*"
  $bin $cmd --device cuda --model 1b --batch "$batch" --seq 2048 --steps "$steps" --eval-batches 0 --sample-tokens 0 \
    --no-save --out-dir /tmp/runs --name "$name" "$@" > /tmp/run1b.txt 2>&1 || tail -5 /tmp/run1b.txt
  python3 bench/metrics_summary.py "/tmp/runs/$name/metrics.jsonl" $((batch * 2048)) "$first"
}

# run_selftest BIN OUT_FILE: `BIN selftest --device cuda` into OUT_FILE, then
# its exit code, the time since the script began ($t0) and the summary and
# failing lines.
run_selftest() {
  "$1" selftest --device cuda > "$2" 2>&1
  echo "selftest rc=$? ($((SECONDS-t0)) s)"; grep -E "cases pass|FAIL" "$2" | head -8
}

# Weight-only product helpers (twenty-fourth session):
# selftest_counts FILE: "N pass, M FAIL" of a selftest's output.
selftest_counts() {
  echo "$(grep -cE '\bpass\b' "$1") pass, $(grep -c FAIL "$1") FAIL"
}
# mixed_ratios FILE same|copy: one line of "KxN M ratio" for the small-M rows of
# `octet bench mixed --device cuda`, against the same-size copy or the 1 GiB copy.
mixed_ratios() {
  if [ "$2" = same ]; then
    grep -E "graph, vs the same-size copy" "$1" | sed 's/   */ /g' | awk '{print $5 $6, $7, $(NF-2)}'
  else
    grep -E "^mixed.*[0-9] weights back to back in a graph" "$1" | sed 's/   */ /g' | awk '{print $5 $6, $7, $(NF-1)}'
  fi | sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
}
# generate_rows FILE: the fp8 and bf16 rows (prefill, decode tok/s) of `octet generate --compare`.
generate_rows() {
  grep -a -A3 "matrix bytes" "$1" | tail -2 | paste -sd' '
}
# mixed_configs VAR "CFG ..." REPS same|copy [bench mixed flags...]: with the
# environment variable VAR set to each configuration in turn, the weight-only
# selftest cases; then `octet bench mixed --device cuda` with the flags, every
# configuration in turn, REPS rounds, each printed as `mixed_ratios`. Writes
# into $R; reads $t0.
mixed_configs() {
  local var=$1 cfgs=$2 reps=$3 measure=$4 c rep
  shift 4
  for c in $cfgs; do
    env "$var=$c" OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > "$R/selftest-$c.txt" 2>&1
    echo "selftest $c rc=$? ($((SECONDS-t0)) s): $(selftest_counts "$R/selftest-$c.txt")"
  done
  for rep in $(seq "$reps"); do
    for c in $cfgs; do
      env "$var=$c" dev-bin/octet bench mixed --device cuda "$@" > "$R/mixed-$c-$rep.txt" 2>&1
      echo "== $c rep $rep rc=$? ($((SECONDS-t0)) s)"
      mixed_ratios "$R/mixed-$c-$rep.txt" "$measure"
    done
  done
}
# mixed_sets VAR "NAME=VALUE ..." REPS copy|same [bench mixed flags...]: as
# mixed_configs, with each configuration named (VALUE may hold commas and
# colons; an empty VALUE unsets VAR), files written straight into $R.
mixed_sets() {
  local var=$1 sets=$2 reps=$3 measure=$4 s n v rep
  shift 4
  for s in $sets; do
    n=${s%%=*} v=${s#*=}
    env "$var=$v" OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > "$R/selftest-$n.txt" 2>&1
    echo "selftest $n ($v) rc=$? ($((SECONDS-t0)) s): $(selftest_counts "$R/selftest-$n.txt")"
  done
  for rep in $(seq "$reps"); do
    for s in $sets; do
      n=${s%%=*} v=${s#*=}
      env "$var=$v" dev-bin/octet bench mixed --device cuda "$@" > "$R/mixed-$n-$rep.txt" 2>&1
      echo "== $n rep $rep rc=$? ($((SECONDS-t0)) s)"
      mixed_ratios "$R/mixed-$n-$rep.txt" "$measure"
    done
  done
}
# old_vs_new "SELFTEST_BINS" [bench mixed flags...]: the weight-only selftest
# cases of each of SELFTEST_BINS (names in dev-bin), then `octet bench mixed`
# with the flags and decode on the ~1B model, dev-bin/octet-old and
# dev-bin/octet in turn, twice each. Writes into $R; reads $t0.
old_vs_new() {
  local st=$1 bin rep
  shift
  for bin in $st; do
    OCTET_SELFTEST_ONLY=mixed dev-bin/$bin selftest --device cuda > "$R/selftest-$bin.txt" 2>&1
    echo "selftest $bin rc=$? ($((SECONDS-t0)) s): $(selftest_counts "$R/selftest-$bin.txt")"
  done
  for rep in 1 2; do
    for bin in octet-old octet; do
      dev-bin/$bin bench mixed --device cuda "$@" > "$R/mixed-$bin-$rep.txt" 2>&1
      echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
      mixed_ratios "$R/mixed-$bin-$rep.txt" copy
    done
  done
  for rep in 1 2; do
    for bin in octet-old octet; do
      dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
        --temperature 0 > "$R/generate-$bin-$rep.txt" 2>&1
      echo "generate $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows "$R/generate-$bin-$rep.txt")"
    done
  done
}
# large_m_old_vs_new: `octet bench mixed --m 256,2048` on the issue's three
# weights, dev-bin/octet-old and dev-bin/octet in turn, twice, each run's
# ratios against cuBLASLt bf16 on one line. Writes into $R; reads $t0.
large_m_old_vs_new() {
  local bin rep
  for rep in 1 2; do
    for bin in octet-old octet; do
      dev-bin/$bin bench mixed --device cuda --m 256,2048 --kn 4096x4096,4096x14336,8192x28672 > "$R/mixed-$bin-$rep.txt" 2>&1
      echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
      grep -E "^mixed.*M=(256|2048)" "$R/mixed-$bin-$rep.txt" | sed 's/   */ /g' | awk '{print $4, $5, $6, $7, $(NF-2)}' | paste -sd' '
    done
  done
}

# Thirty-first session helpers.
# text_md5 FILE: md5 (12 hex digits) of `octet generate`'s printed text before its
# table, without non-ASCII bytes (the echo groups invalid UTF-8 per chunk).
text_md5() { awk '/^weights  matrix bytes/{exit} {print}' "$1" | tr -cd '\11\12\15\40-\176' | md5sum | cut -c1-12; }
# tiled_ratios FILE: "KxN M ratio" of the tiled rows back to back in a graph
# (share of the 1 GiB copy) of `octet bench mixed --device cuda`.
tiled_ratios() {
  grep -E "^mixed.*[0-9] weights back to back in a graph" "$1" | grep -v "row-major\|x f16" | sed 's/   */ /g' |
    awk '{print $5 $6, $7, $(NF-1)}' | sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
}
# tiled_vs_row FILE: "KxN M tiled|row ratio" of the same rows, both layouts.
tiled_vs_row() {
  grep -E "weights back to back in a graph" "$1" | grep "^mixed" | sed 's/   */ /g' |
    awk '{kn=$5 $6; m=$7; r=$(NF-1); if ($0 ~ /row-major/) print kn, m, "row", r; else if ($0 ~ /x f16/) print kn, m, "f16", r; else print kn, m, "tiled", r}' |
    sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
}

# Thirty-second session helpers.
# f16_ratios FILE: "KxN M ratio" of the f16-x rows back to back in a graph.
f16_ratios() {
  grep -E "^mixed.*x f16, [0-9]+ weights back to back in a graph" "$1" | sed 's/   */ /g' |
    awk '{print $5 $6, $7, $(NF-1)}' | sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
}
# large_m_rows FILE: the M > 64 rows (ratio against cuBLASLt bf16), one line.
large_m_rows() {
  grep -E "^mixed.*M=(256|2048)" "$1" | sed 's/   */ /g' |
    awk '{t="tiled"; if ($0 ~ /x f16/) t="f16"; else if ($0 ~ /row-major/) t="row"; print $4, $5 $6, $7, t, $(NF-2)}' |
    sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
}
# l2_rows FILE: "KxN M ratio" (ratio of the 1 GiB copy) for the L2-resident rows of
# `octet bench mixed --device cuda` (one weight over and over in a graph), bf16 x
# then f16 x (forty-fourth session).
l2_rows() {
  local how
  for how in bf16 f16; do
    echo -n "$how x: "
    grep -a "L2-resident" "$1" | if [ $how = f16 ]; then grep -a "x f16"; else grep -av "x f16"; fi |
      sed 's/   */ /g' | awk '{print $5 $6, $7, $(NF-4) "GB/s", $(NF-1)}' |
      sed 's/K=//;s/N=/x/;s/M=//;s/,//g' | paste -sd' '
  done
}
# wide_round ROUND WIDE [bench mixed flags...]: `octet bench mixed --device cuda`
# with OCTET_MIXED_WIDE unset (WIDE = default) or set to WIDE, into
# $R/mixed-ROUND-WIDE.txt; then its back-to-back and L2-resident rows. Reads $B, $t0.
wide_round() {
  local round=$1 wide=$2
  shift 2
  if [ "$wide" = default ]; then unset OCTET_MIXED_WIDE; else export OCTET_MIXED_WIDE=$wide; fi
  timeout 150 "$B" bench mixed --device cuda "$@" > "$R/mixed-$round-$wide.txt" 2>&1
  echo "== round $round wide $wide rc=$? ($((SECONDS-t0)) s)"
  echo "back to back (DRAM): $(tiled_vs_row "$R/mixed-$round-$wide.txt")"
  l2_rows "$R/mixed-$round-$wide.txt" | sed 's/^/L2-resident, /'
  unset OCTET_MIXED_WIDE
}
# dev_bin DIR (forty-fifth session): unpack dev-bin/*.gz, make the binaries
# executable, set B to dev-bin/octet and R to DIR (created): the preamble of a
# device script that carries dev-bin.
dev_bin() {
  gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
  B=$PWD/dev-bin/octet; R=$1; mkdir -p "$R"
}
# gpu_line: the GPU's name, memory, driver and maximum clocks.
gpu_line() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
}
# timed_selftest LABEL FILE SECONDS [VAR=VALUE ...]: `$B selftest --device cuda`
# under `timeout SECONDS` with the variables set, into $R/FILE; then "LABEL rc=N
# (T s): summary", the device line (it names the 16-token shapes taken) and up to
# 10 failing lines. Reads $B, $R, $t0.
timed_selftest() {
  local label=$1 file=$R/$2 secs=$3
  shift 3
  env "$@" timeout "$secs" "$B" selftest --device cuda > "$file" 2>&1
  echo "$label rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' "$file" | head -3)"
  grep -a -m1 "DRAM peak" "$file" | cut -c1-400
  grep -a FAIL "$file" | head -10 | cut -c1-300
}
