bin=dev-bin/octet
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$?"
grep -E "FAIL|all .* cases" $OUT/selftest.txt | cut -c1-160
grep -iE "fail" $OUT/selftest.txt | cut -c1-150 | head
for a in wgmma; do $bin bench attention --device cuda --shapes 4x2048x16x128,1x8192x16x128,4x2048x32x64 2>&1 | grep -E "attention" | cut -c1-140; done
$bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe bf16 --backward high_precision --out-dir /tmp/runs --name 1b-bf16 2>&1 | grep -E "^(bf16|i:)|peak device|Error|error" | cut -c1-200
$bin train --device cuda --model 1b --batch 4 --seq 2048 --steps 6 --eval-batches 0 --sample-tokens 0 \
    --no-save --recipe tensorwise --backward quantized --out-dir /tmp/runs --name 1b-tw 2>&1 | grep -E "^(bf16|i:|tensorwise)|peak device|Error|error" | cut -c1-200
