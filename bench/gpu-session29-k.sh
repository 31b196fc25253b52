#!/usr/bin/env bash
# Twenty-ninth session, call k ($OUT set; carry dev-bin: octet-old = b1953bf
# (16 tokens at 4 warps x 2 stages), octet = 03ebd87 (4 x 3)). Call j's decode
# read 1299.9 tok/s against 1324.9-1353.0 in the session's earlier runs, on a
# fresh machine; decode steps take 1 token (not the changed shape). Decode
# old / new in turn, three rounds.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
{
for rep in 1 2 3; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > $R/generate-$bin-$rep.txt 2>&1
    echo "generate $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$bin-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
