set -uo pipefail
bin=dev-bin/octet
for cfg in "fp8-tensorwise fp8 quantized" "bf16 bf16 high_precision" "fp8-tensorwise fp8 dequantized"; do
  set -- $cfg
  echo "-- lora base $1, compute $2, backward $3 (profiled)"
  OCTET_PROFILE=1 $bin lora --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 --no-save \
      --base-format $1 --compute $2 --backward $3 --out-dir /tmp/runs --name p-$1-$3 2>&1 | grep -E -A18 "profile over|peak"
done
for r in "bf16 high_precision" "tensorwise quantized"; do
  set -- $r
  echo "-- train $1 $2 (profiled)"
  OCTET_PROFILE=1 $bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 --no-save \
      --recipe $1 --backward $2 --out-dir /tmp/runs --name t-$1 2>&1 | grep -E -A18 "profile over|peak"
done
