#!/usr/bin/env bash
# Thirteenth session, final H100 call ($OUT set; carry dev-bin and .whl): the
# committed binary (fused bf16 + RoPE store of the attention backward; the 1b
# preset's own schedule) beside the PyTorch peers, same call:
# - the ~1B training step at batch 16 x 2048, 10 steps, twice each: bf16, and
#   tensorwise quantized with FP8 saved activations; then torch.compile bf16
#   and torchao float8 tensorwise at the same batch;
# - peak memory with FP8 saved activations (tensorwise dequantized), 6 steps;
# - the ~1B LoRA step, batch 4 (FP8 base quantized backward FP8 saved; bf16 base).
set -uo pipefail
t0=$SECONDS
new=dev-bin/octet
# (Second run of this script, after the RMSNorm forward, gain-sum and dq
# changes: first the selftest and the kernels they touch under ncu, one bf16 step.)
if [ -n "${NCU_FIRST:-}" ]; then
  timeout 200 $new selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
  grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
  timeout 150 /usr/local/cuda/bin/ncu --metrics gpu__time_duration.sum --csv \
    --kernel-name regex:"rmsnorm|sum_partials|attn_dq" --launch-count 200 \
    $new train --device cuda --model 1b --batch 16 --seq 2048 --steps 1 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe bf16 --backward high_precision --out-dir /tmp/runs --name ncu > $OUT/ncu-final.csv 2>/dev/null
  python3 bench/ncu_kernels.py $OUT/ncu-final.csv
  echo "ncu done ($((SECONDS-t0)) s)"
fi
. bench/session12_runs.sh
for cfg in "bf16 high_precision full" "tensorwise quantized fp8" "bf16 high_precision full" "tensorwise quantized fp8"; do
  set -- $cfg
  run1b $new train f-$1-$2 16 10 4 --recipe $1 --backward $2 --saved-activations $3
done
run1b $new train f-tw-deq-fp8 16 6 3 --recipe tensorwise --backward dequantized --saved-activations fp8
echo "train done ($((SECONDS-t0)) s)"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
PEERS_BATCH=16 PEERS_SKIP_EAGER=1 PYTHONUNBUFFERED=1 timeout 300 python3 bench/peers_train.py "$OUT/peers-train-1b-b16.json" 10 2>&1 | grep -E "tok/s|not importable|Error"
echo "peers done ($((SECONDS-t0)) s)"
for cfg in "fp8-tensorwise fp8 quantized fp8" "bf16 bf16 high_precision full"; do
  set -- $cfg
  run1b $new lora l-$1-$3 4 8 3 --base-format $1 --compute $2 --backward $3 --saved-activations $4
done
echo "done ($((SECONDS-t0)) s)"
