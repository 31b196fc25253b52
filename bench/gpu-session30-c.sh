#!/usr/bin/env bash
# Thirtieth session, call c ($OUT set; carry dev-bin: octet = HEAD b66d250 with
# bench/session30-ablate.patch applied: OCTET_ABLATE=list skips kernels of the
# decode step, a measurement build only, its text is garbage).
# Where a real decode step's ~0.74 ms goes, with the kernels overlapping as
# they do in the replayed graph (ncu serialises them): decode tok/s of the ~1B
# model with each part of the step left out in turn, FP8 and bf16, two rounds.
#   queue:  no logits download (no host round trip a token), one sync at the end
#   swiglu, rope, attend, norm: that glue kernel left out of every layer
#   mats:   the four products of every layer left out
set -uo pipefail
t0=$SECONDS
R=$OUT/r; mkdir -p $R
{
for rep in 1 2; do
  for wts in fp8 bf16; do
    abl="none queue swiglu rope attend norm swiglu,rope,attend,norm mats mats,queue"
    [ $wts = bf16 ] && abl="none queue mats"
    for ab in $abl; do
      [ $SECONDS -gt 540 ] && break
      OCTET_ABLATE=$ab dev-bin/octet generate --random-model 1b --device cuda --weights $wts --max-tokens 256 \
        --temperature 0 > $R/g.txt 2>&1
      echo "$wts $ab rep $rep rc=$?: $(grep -a -A2 'matrix bytes' $R/g.txt | tail -1)"
    done
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
