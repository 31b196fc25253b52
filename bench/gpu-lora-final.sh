#!/usr/bin/env bash
# Final GPU run of the LoRA work (issue 5): selftest, the ~1B LoRA configurations,
# cuBLAS's skinny LoRA products in PyTorch.   bench/gpu-lora-final.sh OUT_DIR
set -uo pipefail
out="${1:?output directory}"; bin=dev-bin/octet; mkdir -p "$out"
exec > >(tee "$out/log-final.txt") 2>&1
$bin selftest --device cuda > "$out/selftest.txt" 2>&1; echo "selftest rc=$?"
grep -E "FAIL|LoRA|row-wise-only|all .* cases" "$out/selftest.txt" | cut -c1-200
SKIP_PEERS=1 bench/gpu-lora.sh "$out" 1b
python3 bench/skinny_gemm.py
