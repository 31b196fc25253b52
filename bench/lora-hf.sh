#!/usr/bin/env bash
# LoRA fine-tuning at real vocabularies, on Hugging Face model folders with
# random weights (made by transformers: bench/peers/lora_hf.py make), one GPU:
# - llama-3.2-1b (vocabulary 128,256) and qwen2.5-1.5b (151,936, q/k/v biases);
# - octet lora --base FOLDER over an FP8 base (--base-format fp8-tensorwise
#   --compute fp8 --backward quantized), r = 16, alpha 32, on every projection;
# - the peer: PyTorch + PEFT on the same folder, bf16 base, under torch.compile
#   (PEER_RUNS=eager,compile for both);
# - full training of each folder (octet train --init FOLDER --recipe tensorwise),
#   whose end-of-run memory line shows the fused, chunked LM head's share.
# Batch BATCH (default 8) x 2048 tokens; octet on its default text (byte
# tokens), the peers on random tokens: their losses do not compare.
#
#   OCTET=target/release/octet bash bench/lora-hf.sh OUT_DIR
#
# STEPS, PEER_STEPS (default 10): steps a run (the first 3 left out of tokens/s);
# SHAPES (default "llama-3.2-1b qwen2.5-1.5b"). Writes models/ (about 6 GB),
# runs/, peers-lora-SHAPE.json and the logs into OUT_DIR.
# Needs one GPU with 40 GB of memory, PyTorch, transformers and PEFT.
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
bench_init "$@"

STEPS=${STEPS:-10}
PEER_STEPS=${PEER_STEPS:-10}
PEER_RUNS=${PEER_RUNS:-compile}
BATCH=${BATCH:-8}
SHAPES=${SHAPES:-"llama-3.2-1b qwen2.5-1.5b"}
common=(--device cuda --tokenizer byte --batch "$BATCH" --seq 2048 --steps "$STEPS"
  --eval-batches 0 --sample-tokens 0 --no-save)
for s in $SHAPES; do
  step make-$s "$PYTHON" "$PEERS/lora_hf.py" make "$s" "$OUT/models/$s"
  octet_run lora-$s lora "${common[@]}" --base "$OUT/models/$s" \
    --base-format fp8-tensorwise --compute fp8 --backward quantized
  step peers-lora-$s "$PYTHON" "$PEERS/lora_hf.py" run "$OUT/models/$s" "$OUT/peers-lora-$s.json" \
    --batch "$BATCH" --steps "$PEER_STEPS" --warmup 3 --runs "$PEER_RUNS"
  octet_run train-$s train "${common[@]}" --init "$OUT/models/$s" --recipe tensorwise
done

summarize() {
  local tokens=$((BATCH * 2048))
  for s in $SHAPES; do
    echo "  $s: LoRA r=16 over an FP8 base against PEFT (bf16 base), and full training (tensorwise), batch $BATCH x 2048:"
    summarize_py runs --dir "$OUT/runs" --names lora-$s,train-$s --first 4 --tokens "$tokens" \
      --peers "$OUT/peers-lora-$s.json" --ratios "lora-$s/peer: torch+peft bf16 LoRA compile"
    grep -h "memory at the peak" "$OUT/train-$s.log" "$OUT/lora-$s.log" 2>/dev/null | sed 's/^/    /'
  done
}
bench_finish summarize
