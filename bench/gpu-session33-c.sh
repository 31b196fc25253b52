#!/usr/bin/env bash
# Thirty-third session, call c ($OUT set; carry dev-bin: octet.gz = the
# call-a binary (OCTET_MIXED_EXP hook), octet-head.gz = 863da3e). Call b
# compared the variants against the restructured kernel (the k loop in a
# lambda, 96 registers), not against HEAD. Here HEAD and "direct" (no
# per-block accumulator for tensor / row scales) side by side, three rounds,
# with shapes of more warps or stages (OCTET_MIXED_TUNE) for direct.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r33c; mkdir -p $R
{
for rep in 1 2 3; do
  for v in head direct head-263 direct-263 direct-282 direct-244 direct-step2; do
    b=dev-bin/octet
    case $v in
      head) b=dev-bin/octet-head; e="X=1";;
      head-263) b=dev-bin/octet-head; e="OCTET_MIXED_TUNE=2:6:3";;
      direct) e="OCTET_MIXED_EXP=direct";;
      direct-263) e="OCTET_MIXED_EXP=direct OCTET_MIXED_TUNE=2:6:3";;
      direct-282) e="OCTET_MIXED_EXP=direct OCTET_MIXED_TUNE=2:8:2";;
      direct-244) e="OCTET_MIXED_EXP=direct OCTET_MIXED_TUNE=2:4:4";;
      direct-step2) e="OCTET_MIXED_EXP=direct,step2";;
    esac
    env $e $b bench mixed --device cuda --m 12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$v-$rep.txt 2>&1
    echo "== $v rep $rep rc=$? ($((SECONDS-t0)) s) bf16 x: $(tiled_ratios $R/mixed-$v-$rep.txt) | f16 x: $(f16_ratios $R/mixed-$v-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
