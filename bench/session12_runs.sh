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
