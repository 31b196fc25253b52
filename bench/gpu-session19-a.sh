#!/usr/bin/env bash
# Nineteenth session, first call ($OUT set; carry dev-bin): LoRA dropout and
# the eighteenth session's GPU paths never run on a device.
# - `octet selftest --device cuda` (new: the dropout kernels bit for bit,
#   a q/k/v-like group with dropout against the CPU, two whole-model cases
#   with dropout 0.1);
# - `octet lora --lora-dropout 0.1` GPU against CPU (same masks), on the FP8
#   checkpoint of dev-bin/ck (the refactored FP8 base constructor), and the
#   128x128-block checkpoint with --compute bf16;
# - `octet train --tokenizer gpt2` GPU against CPU;
# - ~1B LoRA step (batch 4 x 2048, r 16, all seven, FP8 base, quantized
#   backward, FP8 saved activations) with and without dropout 0.1.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
B=dev-bin/octet
R=$OUT/r
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
run_selftest $B $R/selftest.txt
grep -iE "dropout" $R/selftest.txt | cut -c1-260
common="--steps 20 --eval-every 10 --sample-tokens 0 --out-dir /tmp/runs"
for dev in cuda cpu; do
  $B lora --base dev-bin/ck/fp8-tensorwise --base-format fp8-tensorwise --compute fp8 --backward quantized \
     --lora-dropout 0.1 --device $dev --name ld-$dev $common > $R/lora-dropout-$dev.txt 2>&1
  echo "lora dropout $dev rc=$? ($((SECONDS-t0)) s)"
  $B lora --base dev-bin/ck/fp8-block --base-format fp8-block --compute bf16 \
     --device $dev --name lb-$dev $common > $R/lora-block-$dev.txt 2>&1
  echo "lora block $dev rc=$? ($((SECONDS-t0)) s)"
  $B train --tokenizer gpt2 --model tiny --steps 12 --eval-every 6 --sample-tokens 24 --out-dir /tmp/runs \
     --device $dev --name tg-$dev > $R/train-gpt2-$dev.txt 2>&1
  echo "train gpt2 $dev rc=$? ($((SECONDS-t0)) s)"
done
for n in ld-cuda ld-cpu lb-cuda lb-cpu tg-cuda tg-cpu; do
  python3 -c "
import json,sys
r=[json.loads(l) for l in open('/tmp/runs/$n/metrics.jsonl')]
tr=[x for x in r if 'loss' in x and 'val_loss' not in x]
vl=[x for x in r if x.get('val_loss') is not None]
print('$n', 'train', [round(x['loss'],4) for x in tr[:3]], '...', round(tr[-1]['loss'],4) if tr else None, 'val', [(x.get('step'), round(x['val_loss'],4)) for x in vl])
" 2>&1 | tee -a $R/summary.txt
done
grep -h "lora_dropout" /tmp/runs/ld-cuda/checkpoints/*/adapter_config.json | head -1
tail -4 $R/train-gpt2-cuda.txt
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
for rep in 1 2; do
  run1b $B lora l-nodrop-$rep 4 8 3 $fp8 | tee -a $R/steps.txt
  run1b $B lora l-drop-$rep 4 8 3 $fp8 --lora-dropout 0.1 | tee -a $R/steps.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
