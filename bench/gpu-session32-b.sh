#!/usr/bin/env bash
# Thirty-second session, call b ($OUT set; carry dev-bin: octet.gz = the
# f16-activation build, uncommitted on 6ee7a1e). f16 x in every weight-only
# kernel (small-M, wgmma, upcast + cuBLASLt f16): the full selftest, the
# weight-only cases under the integer conversions (OCTET_FP8_CONVERT=soft)
# and on the upcast path (OCTET_MIXED=upcast); bench mixed with the f16-x
# rows beside bf16, two rounds; two 16-token shapes for f16 x; decode.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz; chmod +x dev-bin/*
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
nvidia-smi --query-gpu=name,clocks.max.sm,clocks.max.mem --format=csv,noheader
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "FAIL" $R/selftest.txt | head -20
grep -a "x f16" $R/selftest.txt | sort -t';' -k2 | tail -3
grep -a "f16 x" $R/selftest.txt
OCTET_FP8_CONVERT=soft OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-soft.txt 2>&1
echo "selftest soft rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-soft.txt)"
grep -a "FAIL" $R/selftest-soft.txt | head -10
OCTET_MIXED=upcast OCTET_SELFTEST_ONLY=mixed dev-bin/octet selftest --device cuda > $R/selftest-upcast.txt 2>&1
echo "selftest upcast rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-upcast.txt)"
grep -a "FAIL" $R/selftest-upcast.txt | head -10
for rep in 1 2; do
  dev-bin/octet bench mixed --device cuda --m 1,2,4,8,12,16,256,2048 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$rep.txt 2>&1
  echo "== bench rep $rep rc=$? ($((SECONDS-t0)) s)"
  echo "bf16 x: $(tiled_ratios $R/mixed-$rep.txt)"
  echo "f16 x:  $(f16_ratios $R/mixed-$rep.txt)"
  echo "large:  $(large_m_rows $R/mixed-$rep.txt)"
done
for c in 2:6:3 2:8:2; do
  OCTET_MIXED_TUNE=$c dev-bin/octet bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-tune-${c//:/-}.txt 2>&1
  echo "== tune $c rc=$? ($((SECONDS-t0)) s) f16 x: $(f16_ratios $R/mixed-tune-${c//:/-}.txt) bf16 x: $(tiled_ratios $R/mixed-tune-${c//:/-}.txt)"
done
dev-bin/octet generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g.txt 2>&1
echo "greedy rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g.txt) text $(text_md5 $R/g.txt)"
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
