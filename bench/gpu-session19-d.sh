#!/usr/bin/env bash
# Nineteenth session, last call ($OUT set; carry dev-bin): after the bf16
# input-gradient sums (dev-bin/octet; dev-bin/octet-old before them):
# - the default small model (300 steps, Tiny Shakespeare) under every recipe
#   on the new binary, bf16 and tensorwise on the old one too: final
#   validation loss against bf16 (issue 4's 2% convergence target);
# - the ~1B LoRA step, FP8 base (compute fp8, quantized backward, FP8 saved
#   activations) and bf16 base, new binary, alternated twice (issue 5).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
conv() {
  local bin=$1 recipe=$2
  dev-bin/$bin train --device cuda --recipe $recipe --sample-tokens 0 --no-save \
    --out-dir /tmp/runs --name s-$bin-$recipe > /tmp/s.txt 2>&1 || tail -5 /tmp/s.txt
  printf "%-10s %-11s " $bin $recipe
  python3 -c "
import json
r=[json.loads(l) for l in open('/tmp/runs/s-$bin-$recipe/metrics.jsonl')]
v=[x['val_loss'] for x in r if x.get('val_loss') is not None]
t=[x for x in r if 'tokens_per_s' in x]
print('final val %.4f  final train %.4f  steps %d' % (v[-1], t[-1]['loss'], t[-1]['step']))
"
}
for rec in bf16 delayed tensorwise rowwise blockwise mxfp8 nvfp4; do conv octet $rec | tee -a $R/converge.txt; done
for rec in bf16 tensorwise; do conv octet-old $rec | tee -a $R/converge.txt; done
echo "converge done ($((SECONDS-t0)) s)"
fp8="--base-format fp8-tensorwise --compute fp8 --backward quantized --saved-activations fp8"
bf16="--base-format bf16 --compute bf16 --backward high_precision"
for rep in 1 2; do
  run1b dev-bin/octet lora l-fp8-$rep 4 8 3 $fp8 | tee -a $R/lora.txt
  run1b dev-bin/octet lora l-bf16-$rep 4 8 3 $bf16 | tee -a $R/lora.txt
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
