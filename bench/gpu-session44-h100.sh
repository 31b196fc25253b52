#!/usr/bin/env bash
# For the first H100 lent after the forty-fourth session (carry dev-bin: octet.gz =
# HEAD). That session gave 16-token launches the few-block shape on every device
# (the H100 included), on a prediction: 4096x4096 at 9-16 tokens near 0.87 of copy
# against 0.81-0.82 with the table's shape (crates/octet-cuda/src/mixed.rs,
# `shapes16`). This measures it: the full selftest; the weight-only selftest with
# integer FP8 conversions; issue 6's table at the default (few-block) and under
# OCTET_MIXED_WIDE=0 (the table's shapes), two rounds in opposite orders, with the
# L2-resident rows; M = 2048; decode with FP8 against bf16 weights.
# Since the forty-sixth session f16 x keeps SMALL_F16_FEW on the H100 (the few-block
# shape follows the wide ones for f16 x): the rounds under OCTET_MIXED_WIDE=1 on
# 4096x4096 (where no wide shape applies) time the few-block shape with f16 x there.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
dev_bin /tmp/r44h
{
gpu_line
timed_selftest selftest selftest.txt 300
timed_selftest "soft mixed selftest" selftest-soft.txt 200 OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed
for r in "1 default" "1 0" "2 0" "2 default"; do
  wide_round $r --m 1,4,8,12,16 --kn 4096x4096,4096x14336,8192x28672
done
for r in "1 1" "2 1"; do wide_round $r --m 12,16 --kn 4096x4096; done
timeout 150 $B bench mixed --device cuda --m 2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-2048.txt 2>&1
echo "== M = 2048 rc=$? ($((SECONDS-t0)) s): $(large_m_rows $R/mixed-2048.txt)"
timeout 200 $B generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/decode.txt 2>&1
echo "decode 1b rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/decode.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
tar czf $OUT/raw.tgz -C $R .
