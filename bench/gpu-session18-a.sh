#!/usr/bin/env bash
# Eighteenth session ($OUT set; carry dev-bin): the GPU paths added in the
# seventeenth session, never run on a device before.
# - `octet selftest --device cuda` (with the new LoRA-on-FP8-checkpoint cases);
# - `octet lora --base DIR` on FP8 checkpoints written by `octet lora merge
#   --dtype fp8` on the CPU (dev-bin/ck: per-tensor codes, and 128x128-block
#   codes), GPU against CPU, same steps and seed;
# - `octet train --init DIR` on the GPU against the CPU.
set -uo pipefail
t0=$SECONDS
B=dev-bin/octet
R=$OUT/r
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv > $R/gpu.txt
$B selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$?"; grep -E "pass|FAIL" $R/selftest.txt | tail -3
grep -i "checkpoint codes" $R/selftest.txt
common="--steps 20 --eval-every 10 --sample-tokens 0 --out-dir /tmp/runs"
for dev in cuda cpu; do
  $B lora --base dev-bin/ck/fp8-tensorwise --base-format fp8-tensorwise --compute fp8 --backward quantized \
     --device $dev --name lt-$dev $common > $R/lora-tensorwise-$dev.txt 2>&1
  echo "lora tensorwise $dev rc=$?"
  $B lora --base dev-bin/ck/fp8-block --base-format fp8-block --compute bf16 \
     --device $dev --name lb-$dev $common > $R/lora-block-$dev.txt 2>&1
  echo "lora block $dev rc=$?"
  $B train --init dev-bin/ck/fp8-block --device $dev --name ti-$dev $common > $R/train-init-$dev.txt 2>&1
  echo "train init $dev rc=$?"
done
for f in $R/lora-*.txt $R/train-init-*.txt; do
  echo "== $f"; grep -E "LoRA on|init|base matrices|val loss|^lora|^i:" $f | head -8
done
for n in lt-cuda lt-cpu lb-cuda lb-cpu ti-cuda ti-cpu; do
  python3 -c "
import json,sys
r=[json.loads(l) for l in open('/tmp/runs/$n/metrics.jsonl')]
tr=[x for x in r if 'loss' in x and 'val_loss' not in x]
vl=[x for x in r if 'val_loss' in x]
print('$n', 'train', [round(x['loss'],4) for x in tr[:3]], '...', round(tr[-1]['loss'],4) if tr else None, 'val', [(x.get('step'), round(x['val_loss'],4)) for x in vl])
" 2>&1 | tee -a $R/summary.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
