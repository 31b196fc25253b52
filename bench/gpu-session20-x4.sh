#!/usr/bin/env bash
# Twentieth session, for a machine of several GPUs ($OUT set; carry dev-bin):
# issue 7's weak scaling and memory on the ~1B model at a per-GPU batch of
# 8 x 2048. One GPU unsharded (bf16, tensorwise), then every GPU as one rank
# each (bf16 gathers; tensorwise with FP8 gathers), with and without
# --recompute. Tokens/s of the whole job over steps 4-10, rank 0's peak
# device memory, and the bytes rank 0 handed to NCCL per step.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
export NCCL_NVLS_ENABLE=0
R=$OUT/r
mkdir -p $R
nvidia-smi --query-gpu=name,memory.total --format=csv | tee $R/gpus.txt
ngpu=$(nvidia-smi -L | wc -l)
for r in bf16 tensorwise; do
  run1b dev-bin/octet train one-$r 8 10 4 --recipe $r | tee -a $R/dist.txt
done
for rc in "" --recompute; do
  for r in bf16 tensorwise; do
    run1b dev-bin/octet train n$ngpu-$r$rc $((8 * ngpu)) 10 4 --recipe $r --nproc $ngpu $rc | tee -a $R/dist.txt
    grep -E "NCCL per step|Error|error" /tmp/run1b.txt | head -3 | tee -a $R/dist.txt
  done
  echo "$rc done ($((SECONDS-t0)) s)"
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
