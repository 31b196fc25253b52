#!/usr/bin/env bash
# Twenty-sixth session, call a ($OUT set; carry dev-bin): FP8 conversions in
# integer code (what sm_80 / sm_86 run) checked and timed on an FP8 GPU.
# 1. the full selftest with hardware conversions (new: every code decoded,
#    every bf16 value encoded, every code through the weight-only products);
# 2. the full selftest as an Ampere GPU runs it: OCTET_FP8_CONVERT=soft and
#    OCTET_FP8_GEMM=off (FP8 GEMM groups skipped, the refusal checked);
# 3. the weight-only cases and `bench mixed` with hardware and integer
#    conversions in turn, two rounds (M = 1-16 and 2048, three weights);
# 4. decode on the ~1B model, both ways; LoRA with a bf16-compute FP8 base
#    and bf16 training as an Ampere GPU; an FP8 recipe there (must be refused).
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv,noheader > $R/gpu.txt
run_selftest dev-bin/octet $R/selftest-hw.txt
OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off dev-bin/octet selftest --device cuda > $R/selftest-ampere.txt 2>&1
echo "selftest ampere rc=$? ($((SECONDS-t0)) s)"; grep -E "cases pass|FAIL|skipped" $R/selftest-ampere.txt | head -8
mixed_configs OCTET_FP8_CONVERT "auto soft" 2 copy --m 1,4,8,16,2048 --kn 4096x4096,4096x14336,8192x28672
for c in auto soft; do
  OCTET_FP8_CONVERT=$c OCTET_FP8_GEMM=$([ $c = soft ] && echo off || echo auto) dev-bin/octet generate --random-model 1b \
    --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$c.txt 2>&1
  echo "generate $c rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$c.txt)"
done
export OCTET_FP8_CONVERT=soft OCTET_FP8_GEMM=off
dev-bin/octet lora --device cuda --compute bf16 --steps 20 --no-save --out-dir /tmp/runs --name lora-ampere > $R/lora-ampere.txt 2>&1
echo "lora ampere rc=$? ($((SECONDS-t0)) s)"; tail -3 $R/lora-ampere.txt
dev-bin/octet train --device cuda --recipe bf16 --steps 30 --no-save --out-dir /tmp/runs --name bf16-ampere > $R/train-ampere.txt 2>&1
echo "train bf16 ampere rc=$? ($((SECONDS-t0)) s)"; tail -3 $R/train-ampere.txt
dev-bin/octet train --device cuda --recipe tensorwise --steps 5 --no-save --out-dir /tmp/runs --name fp8-ampere > $R/train-fp8-ampere.txt 2>&1
echo "train tensorwise ampere rc=$? (expected non-zero) ($((SECONDS-t0)) s)"; tail -2 $R/train-fp8-ampere.txt
echo "done ($((SECONDS-t0)) s)"
