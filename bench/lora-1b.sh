#!/usr/bin/env bash
# LoRA fine-tuning of the ~1B Llama on one GPU (random frozen base, r = 16,
# alpha 32, on q, k, v, o, gate, up, down), batch 4 x 2048 tokens:
# - octet with an FP8 base: --base-format fp8-tensorwise --compute fp8
#   --backward quantized --saved-activations fp8;
# - octet with a bf16 base: --base-format bf16 --compute bf16 --backward high_precision;
# - bench/peers/lora.py: PyTorch + PEFT, bf16 base, eager and under torch.compile
#   (skipped without PEFT).
# Prints tokens/s, step time and peak memory of each, and FP8 base against bf16 base.
#
#   OCTET=target/release/octet bash bench/lora-1b.sh OUT_DIR
#
# STEPS (default 10): octet's steps a run; PEER_STEPS (default 10): the peers'
# (the first 3 of each are left out of tokens/s).
# Writes runs/NAME/metrics.jsonl (octet), peers-lora.json and the logs into OUT_DIR.
# Needs one GPU with about 16 GB of memory; PyTorch and PEFT for the peers.
# About 2 minutes on an H100.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

STEPS=${STEPS:-10}
PEER_STEPS=${PEER_STEPS:-10}
common=(--device cuda --model 1b --batch 4 --seq 2048 --steps "$STEPS"
  --eval-batches 0 --sample-tokens 0 --no-save)
# Each run is in OUT_DIR, which holds no runs/default: the base is a random 1b model.
octet_run lora-fp8-base lora "${common[@]}" \
  --base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8
octet_run lora-bf16-base lora "${common[@]}" \
  --base-format bf16 --compute bf16 --backward high_precision
step peers-lora "$PYTHON" "$PEERS/lora.py" "$OUT/peers-lora.json" \
  --batch 4 --steps "$PEER_STEPS" --warmup 3 --runs eager,compile

summarize() {
  echo "  ~1B Llama LoRA r=16, batch 4 x 2048 tokens; octet: steps 4-$STEPS timed; peak device = the driver's used memory;"
  echo "  the peers train on random tokens, octet on its default text: their losses do not compare"
  summarize_py runs --dir "$OUT/runs" --names lora-fp8-base,lora-bf16-base --first 4 --tokens 8192 \
    --peers "$OUT/peers-lora.json" \
    --ratios "lora-fp8-base/lora-bf16-base,lora-fp8-base/peer: torch+peft bf16 LoRA compile"
}
bench_finish summarize
