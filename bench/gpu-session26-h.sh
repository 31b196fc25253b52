#!/usr/bin/env bash
# Twenty-sixth session, call h ($OUT set; carry dev-bin: HEAD): the H100 as
# close to an Ampere GPU's code paths as its switches go. Integer FP8
# conversions, no FP8 GEMMs, the mma.sync attention kernels (not wgmma), and
# the upcast + cuBLASLt path for weight-only products at M > 64 (not wgmma):
# the full selftest, ~1B bf16 training for 20 steps, and decode.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
export OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off OCTET_ATTN=mma OCTET_MIXED=upcast
dev-bin/octet selftest --device cuda > $R/selftest-ampere-paths.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s)"; grep -E "cases pass|FAIL" $R/selftest-ampere-paths.txt | head -8
dev-bin/octet train --device cuda --model 1b --recipe bf16 --batch 4 --seq 2048 --steps 20 --eval-batches 0 \
  --sample-tokens 0 --no-save --out-dir /tmp/runs --name bf16-1b > $R/train-1b.txt 2>&1
echo "train 1b bf16 rc=$? ($((SECONDS-t0)) s)"; grep -aE "^bf16|peak" $R/train-1b.txt | head -3
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
  --temperature 0 > $R/generate.txt 2>&1
echo "generate rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate.txt)"
echo "done ($((SECONDS-t0)) s)"
