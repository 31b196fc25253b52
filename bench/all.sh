#!/usr/bin/env bash
# Every GPU script of the suite, one after another, each into a subfolder of
# OUT_DIR named after it, then one combined summary (OUT_DIR/summary.txt):
#   selftest, gemm-linear, quantize, weight-only, attention, train-1b,
#   lora-1b, lora-hf, generate-1b, multi-gpu (skips itself on one GPU).
#
#   OCTET=target/release/octet bash bench/all.sh OUT_DIR
#
# SKIP="name ..." leaves scripts out (e.g. SKIP="selftest multi-gpu");
# ONLY="name ..." runs just those. The other variables (STEPS, PEER_STEPS,
# WHEELS, PYTHON, STEP_TIMEOUT, NPROC, ...) pass through to the scripts.
# About 15 minutes on one H100 with PyTorch, torchao, transformers and PEFT installed.
# cpu.sh is not part of it. Exits non-zero if any script had a failed step.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

SCRIPTS="selftest gemm-linear quantize weight-only attention train-1b lora-1b lora-hf generate-1b multi-gpu"
t_all=$SECONDS
for s in $SCRIPTS; do
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $s "* ]]; then continue; fi
  if [[ " ${SKIP:-} " == *" $s "* ]]; then
    skip_step "$s" "in SKIP"
    continue
  fi
  echo
  t0=$SECONDS
  bash "$BENCH_DIR/$s.sh" "$OUT/$s"
  rc=$?
  if [ $rc -ne 0 ]; then
    status=FAIL
    BENCH_FAILED=$((BENCH_FAILED + 1))
  elif [ -s "$OUT/$s/steps.tsv" ] && ! awk -F'\t' '$2 != "skipped" { found = 1 } END { exit !found }' "$OUT/$s/steps.tsv"; then
    status=skipped
  else
    status=ok
  fi
  printf '%s\t%s\t%s\t%s\n' "$s" "$status" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
done

summarize() {
  local s
  for s in $SCRIPTS; do
    [ -f "$OUT/$s/summary.txt" ] || continue
    echo
    # Each script's summary under its name, without its own header line.
    echo "[$s]"
    tail -n +2 "$OUT/$s/summary.txt"
  done
  echo
  echo "total: $((SECONDS - t_all)) s"
}
bench_finish summarize
