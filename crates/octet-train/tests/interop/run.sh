#!/usr/bin/env bash
# octet's folders read by transformers, PEFT and compressed-tensors (CPU is enough).
# Needs python3 with torch, transformers, peft and compressed-tensors importable.
#   OCTET=target/release/octet bash crates/octet-train/tests/interop/run.sh WORKDIR
set -euo pipefail
O="${OCTET:-octet}"
W="${1:?work directory}"
rm -rf "$W" && mkdir -p "$W"
q=(--eval-batches 0 --sample-tokens 0 --out-dir "$W")
"$O" train --model tiny --steps 5 "${q[@]}" --name base
"$O" lora --device cpu --base "$W/base" --steps 5 "${q[@]}" --name ad
"$O" lora merge --base "$W/base" --adapter "$W/ad" --out "$W/merged" --dtype f32 --base-format bf16
"$O" export --checkpoint "$W/base" --out "$W/exp-ct" --format compressed-tensors
"$O" export --checkpoint "$W/base" --out "$W/exp-ctt" --format compressed-tensors-tensor
"$O" export --checkpoint "$W/base" --out "$W/exp-blk" --format fp8-block
python3 "$(dirname "$0")/check_interop.py" "$W"
