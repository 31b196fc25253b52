#!/usr/bin/env bash
# Twenty-sixth session, call e ($OUT set; carry dev-bin): the CLI on a GPU
# without FP8 GEMMs (emulated: OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off).
# FP8 recipes with --device cuda stop before training, with --device auto
# train on the CPU; the emulated recipes (mxfp8, nvfp4) and bf16 train on
# the GPU; LoRA with --compute fp8 stops, with bf16 runs.
set -uo pipefail
t0=$SECONDS
R=$OUT/r; mkdir -p $R
export OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off
run() {
  local name=$1; shift
  dev-bin/octet "$@" --no-save --out-dir /tmp/runs --name "$name" > /tmp/$name.txt 2>&1
  echo "== $name rc=$? ($((SECONDS-t0)) s): $*"
  grep -E "^octet|device auto|error|^(bf16|mxfp8|nvfp4|tensorwise|lora) " /tmp/$name.txt | cut -c1-400 | head -4
}
{
run tw-cuda train --device cuda --recipe tensorwise --steps 5
run tw-auto train --device auto --recipe tensorwise --steps 5
run mx-cuda train --device cuda --recipe mxfp8 --steps 20
run nv-cuda train --device cuda --recipe nvfp4 --steps 20
run bf16-cuda train --device cuda --recipe bf16 --steps 20
run lora-fp8 lora --device cuda --compute fp8 --steps 5
run lora-bf16 lora --device cuda --compute bf16 --steps 10
} 2>&1 | tee $R/cli-ampere.txt
echo "done ($((SECONDS-t0)) s)"
