# Sourced by every script of the benchmark suite (bench/README.md); not run by itself.
#
#   . "$(dirname "${BASH_SOURCE[0]}")/common.sh"
#   bench_init "$@"            # OUT = the output folder (first argument, created)
#   step NAME CMD [ARGS...]    # CMD's output into $OUT/NAME.log, its rc into $OUT/steps.tsv
#   bench_finish summarize     # summary.txt (the function's output + the steps), exit code
#
# The octet binary is $OCTET when set (a path, or a command name on PATH), else
# `octet` on PATH. Python peers run with $PYTHON (default python3). Each step
# runs under `timeout $STEP_TIMEOUT` (seconds, default 1200) where `timeout`
# exists. A failed step prints a FAIL line and the suite goes on; the script
# exits non-zero at the end if any step failed.
#
# WHEELS=DIR (optional): Python wheels to use for the peers on a machine without
# a package index (e.g. torchao or peft downloaded elsewhere with `pip download`):
# DIR/*.whl and DIR/*/*.whl are installed once, without dependencies, into
# ${TMPDIR:-/tmp}/octet-bench-site, which goes first on PYTHONPATH.

set -uo pipefail

BENCH_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PEERS=$BENCH_DIR/peers
PYTHON=${PYTHON:-python3}
# Steps run inside the output folder: a relative path to the interpreter is made absolute.
case $PYTHON in /*) ;; */*) PYTHON=$PWD/$PYTHON ;; esac
STEP_TIMEOUT=${STEP_TIMEOUT:-1200}
export PYTHONUNBUFFERED=1
BENCH_FAILED=0

# bench_init "$@": the output folder from the first argument (created, made
# absolute: every step runs inside it), the binary, machine.txt.
bench_init() {
  if [ $# -lt 1 ] || [ -z "${1:-}" ]; then
    echo "usage: bash $0 OUT_DIR   (OCTET=path/to/octet picks the binary; see bench/README.md)" >&2
    exit 2
  fi
  mkdir -p -- "$1" || { echo "error: cannot create the output folder $1" >&2; exit 2; }
  OUT=$(cd -- "$1" && pwd)
  : > "$OUT/steps.tsv"
  bench_resolve_octet
  bench_wheels
  bench_machine > "$OUT/machine.txt" 2>&1
  if [ -z "${BENCH_ON:-}" ]; then
    local n
    n=$(gpu_count)
    if [ "$n" -gt 0 ] && command -v nvidia-smi > /dev/null; then
      BENCH_ON="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1) x$n"
    else
      BENCH_ON="no GPU found"
    fi
  fi
  echo "== $(basename "$0" .sh): results in $OUT"
  echo "   octet: $OCTET ($("$OCTET" --version 2>/dev/null || echo 'no --version'))"
}

# OCTET as an absolute path to an executable, or an error that says what to do.
bench_resolve_octet() {
  local b=${OCTET:-}
  if [ -z "$b" ]; then
    b=$(command -v octet 2>/dev/null) || {
      echo "error: no octet binary: set OCTET (e.g. OCTET=target/release/octet after" \
        "\`cargo build --release -p octet\`) or put octet on PATH" >&2
      exit 2
    }
  elif [[ $b != */* ]]; then
    b=$(command -v -- "$b" 2>/dev/null) || {
      echo "error: OCTET=${OCTET}: no such command on PATH" >&2
      exit 2
    }
  fi
  if [ ! -f "$b" ] || [ ! -x "$b" ]; then
    echo "error: OCTET=$b is not an executable file" >&2
    exit 2
  fi
  case $b in /*) ;; *) b=$PWD/$b ;; esac
  OCTET=$b
  export OCTET
}

# WHEELS=DIR: install the wheels in DIR once (see the top of this file).
bench_wheels() {
  [ -n "${WHEELS:-}" ] || return 0
  [ -n "${OCTET_BENCH_SITE:-}" ] && return 0
  local site=${TMPDIR:-/tmp}/octet-bench-site
  local wheels=()
  shopt -s nullglob
  wheels=("$WHEELS"/*.whl "$WHEELS"/*/*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "warning: WHEELS=$WHEELS holds no .whl files; the peers use the installed packages" >&2
    return 0
  fi
  echo "   installing ${#wheels[@]} wheel(s) from $WHEELS into $site"
  if "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$site" "${wheels[@]}"; then
    export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
    export OCTET_BENCH_SITE=$site
  else
    echo "warning: installing the wheels from $WHEELS failed; the peers use the installed packages" >&2
  fi
}

# What machine.txt holds: date, host, CPU, GPUs, binary, checkout, Python packages.
bench_machine() {
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(uname -srm)"
  local cpu=""
  if command -v lscpu > /dev/null; then
    cpu=$(lscpu | sed -n 's/^Model name: *//p' | head -1)
  fi
  [ -n "$cpu" ] || cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -1)
  echo "cpu: ${cpu:-unknown}, $(nproc 2>/dev/null || echo '?') threads"
  if command -v nvidia-smi > /dev/null; then
    echo "gpus (index, name, driver, memory):"
    nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/  /'
  else
    echo "gpus: nvidia-smi not found"
  fi
  [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && echo "CUDA_VISIBLE_DEVICES: $CUDA_VISIBLE_DEVICES"
  echo "octet: $OCTET"
  echo "octet --version: $("$OCTET" --version 2>&1 || echo 'none')"
  if git -C "$BENCH_DIR" rev-parse --is-inside-work-tree > /dev/null 2>&1; then
    local dirty
    dirty=$(git -C "$BENCH_DIR" status --porcelain --untracked-files=no 2>/dev/null | wc -l)
    echo "git HEAD: $(git -C "$BENCH_DIR" rev-parse HEAD) ($dirty tracked files differ from HEAD)"
  fi
  if command -v "$PYTHON" > /dev/null; then
    "$PYTHON" -W ignore - <<'PY' 2>&1
import importlib, sys
print("python:", sys.version.split()[0])
for m in ("torch", "torchao", "peft", "triton"):
    try:
        print(f"{m}:", importlib.import_module(m).__version__)
    except Exception as e:  # noqa: BLE001
        print(f"{m}: not importable ({type(e).__name__})")
PY
  else
    echo "python: $PYTHON not found"
  fi
}

# step NAME CMD [ARGS...]: run CMD inside $OUT, stdout and stderr into
# $OUT/NAME.log (its first line is the command), under the step timeout.
# Prints one line when it starts and one when it ends: "ok", "skipped" (the
# command exited 0 after a line starting "skipped:") or FAIL with the log's
# last lines. Records "NAME<TAB>status<TAB>rc<TAB>seconds" in $OUT/steps.tsv.
step() {
  local name=$1
  shift
  local log=$OUT/$name.log t0=$SECONDS rc status
  echo "-- $name: $*"
  printf '$ %s\n' "$*" > "$log"
  if command -v timeout > /dev/null; then
    (cd "$OUT" && exec timeout --kill-after=30 "$STEP_TIMEOUT" "$@") >> "$log" 2>&1
  else
    (cd "$OUT" && exec "$@") >> "$log" 2>&1
  fi
  rc=$?
  local secs=$((SECONDS - t0))
  if [ $rc -eq 0 ]; then
    if grep -aq '^skipped:' "$log"; then
      status=skipped
      echo "   skipped ($(grep -a -m1 '^skipped:' "$log" | cut -c10-))"
    else
      status=ok
      echo "   ok ($secs s)"
    fi
  else
    status=FAIL
    BENCH_FAILED=$((BENCH_FAILED + 1))
    if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
      echo "FAIL $name: stopped after $secs s (STEP_TIMEOUT=$STEP_TIMEOUT), rc=$rc; log $log"
    else
      echo "FAIL $name: rc=$rc after $secs s; log $log, last lines:"
    fi
    tail -n 6 "$log" | cut -c1-300 | sed 's/^/     | /'
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$rc" "$secs" >> "$OUT/steps.tsv"
  return 0
}

# skip_step NAME WHY: record a step that was not run.
skip_step() {
  echo "-- $1: skipped: $2"
  printf '%s\t%s\t%s\t%s\n' "$1" skipped - 0 >> "$OUT/steps.tsv"
}

# octet_run NAME SUBCOMMAND [FLAGS...]: `octet SUBCOMMAND FLAGS --out-dir
# $OUT/runs --name NAME` as step NAME, after removing an earlier run of that
# name in this output folder (octet refuses to write over a run).
octet_run() {
  local name=$1
  shift
  rm -rf -- "${OUT:?}/runs/$name"
  step "$name" "$OCTET" "$@" --out-dir "$OUT/runs" --name "$name"
}

# summarize_py ARGS...: bench/summarize.py with ARGS, or a note without Python.
summarize_py() {
  if command -v "$PYTHON" > /dev/null; then
    "$PYTHON" "$BENCH_DIR/summarize.py" "$@" 2>&1
  else
    echo "($PYTHON not found: no summary table; the logs and JSON files are in $OUT)"
  fi
}

# bench_finish [FUNCTION]: FUNCTION's output (the script's summary table) and
# the table of steps into $OUT/summary.txt, printed; exit 1 if a step failed.
bench_finish() {
  {
    echo "== $(basename "$0" .sh): $BENCH_ON; $("$OCTET" --version 2>/dev/null || echo octet)"
    [ $# -gt 0 ] && "$@"
    echo
    echo "steps (logs in $OUT):"
    awk -F'\t' '{ printf "  %-28s %-8s %6s s%s\n", $1, $2, $4, ($2 == "FAIL" ? "  rc=" $3 : "") }' "$OUT/steps.tsv"
  } > "$OUT/summary.txt" 2>&1
  echo
  cat "$OUT/summary.txt"
  if [ "$BENCH_FAILED" -gt 0 ]; then
    echo "$BENCH_FAILED step(s) failed"
    exit 1
  fi
  exit 0
}

# gpu_count: GPUs this process may use (CUDA_VISIBLE_DEVICES, else nvidia-smi -L).
gpu_count() {
  if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then
    local v=${CUDA_VISIBLE_DEVICES// /}
    if [ -z "$v" ]; then echo 0; else echo "$v" | tr ',' '\n' | grep -c .; fi
  elif command -v nvidia-smi > /dev/null; then
    nvidia-smi -L 2>/dev/null | grep -c '^GPU'
  else
    echo 0
  fi
}
