#!/usr/bin/env bash
# Thirty-third session, call d ($OUT set; carry dev-bin: octet.gz = 863da3e
# plus the OCTET_MIXED_EXP hook and "direct" as a kernel-level switch: the
# small-M kernels run a copy of their body without the per-block
# accumulator when the scales are per tensor or per row (SASS: 16-token loop
# 424 -> 390, 4-token 247 -> 233, registers as HEAD); octet-head.gz =
# 863da3e). Calls a-c ran "direct" as a lambda inside the loop (96-100
# registers; f16 x lost 0.02-0.03 with it). Weight-only selftest under
# direct, three rounds of bench mixed (HEAD, direct, direct+step2), decode.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r33d; mkdir -p $R
{
OCTET_MIXED_EXP=direct OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest exp=direct rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a FAIL $R/selftest.txt | head -5
for rep in 1 2 3; do
  for v in head direct direct-step2; do
    b=dev-bin/octet; m=1,8,12,16
    case $v in
      head) b=dev-bin/octet-head; e="X=1";;
      direct) e="OCTET_MIXED_EXP=direct";;
      direct-step2) e="OCTET_MIXED_EXP=direct,step2"; m=12,16;;
    esac
    env $e $b bench mixed --device cuda --m $m --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
for v in head direct; do
  b=dev-bin/octet; e="OCTET_MIXED_EXP=direct"
  [ $v = head ] && { b=dev-bin/octet-head; e="X=1"; }
  env $e $b generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/gen-$v.txt 2>&1
  echo "== generate $v rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/gen-$v.txt) text $(text_md5 $R/gen-$v.txt)"
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
