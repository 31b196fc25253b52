#!/usr/bin/env bash
# Attention kernels on the lent GPU ($OUT set):
#   bash bench/gpu-attn.sh [check] [train] [ncu]
# always: octet's forward and backward at the ~1B model's shape (wgmma forward
# and, with OCTET_ATTN=mma, the mma.sync one) beside PyTorch's SDPA backends;
# check: the conformance suite first; train: ~1B bf16 training steps with each
# forward; ncu: the detailed sections of the kernels.
set -uo pipefail
bin=${BIN:-dev-bin/octet}
args=" $* "
if [[ $args == *" check "* ]]; then
  timeout 400 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
  grep -E "FAIL|attention|all .* cases" $OUT/selftest.txt | cut -c1-220
fi
shapes=4x2048x16x128,1x8192x16x128,4x2048x32x64
$bin bench attention --device cuda --shapes $shapes --json $OUT/attn.json 2>&1 | tee $OUT/attn.txt | grep attention
OCTET_ATTN=mma $bin bench attention --device cuda --shapes $shapes --json $OUT/attn-mma.json 2>&1 | tee $OUT/attn-mma.txt | grep attention
python3 bench/sdpa.py 4 2048 16 128 2>&1 | tee $OUT/sdpa.txt | grep -E "flash|cudnn"
python3 bench/sdpa.py 1 8192 16 128 2>&1 | tee -a $OUT/sdpa.txt | grep -E "flash|cudnn"
if [[ $args == *" train "* ]]; then
  train="$bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 --no-save --out-dir /tmp/runs"
  for fwd in wgmma mma; do
    for r in "bf16 high_precision" "tensorwise quantized"; do
      set -- $r
      OCTET_ATTN=$fwd $train --recipe $1 --backward $2 --name t-$fwd-$1 > $OUT/train-$fwd-$1.txt 2>&1
      echo "-- forward $fwd, $1 / $2"; tail -4 $OUT/train-$fwd-$1.txt | head -3 | cut -c1-200
    done
  done
fi
if [[ $args == *" ncu "* ]]; then
  timeout 240 ncu --clock-control none -k regex:"attn_(fwd|dkdv|dq)_(tc|wg)" --launch-skip 13 --launch-count 3 \
    --section SpeedOfLight --section Occupancy --section WarpStateStats --section ComputeWorkloadAnalysis \
    --section MemoryWorkloadAnalysis --section LaunchStats --section InstructionStats \
    $bin bench attention --device cuda --shapes 4x2048x16x128 > $OUT/ncu-attn.txt 2>&1
  echo "ncu rc=$?"
  grep -E "attn_|Duration|Registers Per|Achieved Occupancy|Issue Slots Busy|Warp Cycles Per Issued" $OUT/ncu-attn.txt | head -40
fi
