#!/usr/bin/env bash
# Twenty-sixth session, call g ($OUT set; carry dev-bin: HEAD): the final
# full selftest in hardware, the full selftest as an Ampere GPU runs it (the
# FP8 cases now skipped one by one, so the bf16 LoRA, MXFP8 / NVFP4 linear
# and telemetry cases run), and a sharded FP8 run refused before its ranks.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
run_selftest dev-bin/octet $R/selftest-hw.txt
OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off dev-bin/octet selftest --device cuda > $R/selftest-ampere.txt 2>&1
echo "selftest ampere rc=$? ($((SECONDS-t0)) s)"; grep -E "cases pass|FAIL|skipped" $R/selftest-ampere.txt | head -8
OCTET_FP8_GEMM=off dev-bin/octet train --nproc 2 --device cuda --recipe tensorwise --steps 2 --no-save \
  --out-dir /tmp/runs --name nproc > $R/nproc-fp8-off.txt 2>&1
echo "train --nproc 2 tensorwise, FP8 GEMMs off rc=$? (expected 1) ($((SECONDS-t0)) s)"; tail -2 $R/nproc-fp8-off.txt | cut -c1-300
echo "done ($((SECONDS-t0)) s)"
