#!/usr/bin/env bash
# Thirty-seventh session, call e ($OUT set; carry dev-bin as call d: octet-c.gz =
# 74bb70d, octet.gz = 16a86e2). Call d ran the old binary first on a fresh machine
# and the new one second: 42.9 s against 2.5 s for a first training run, which mixes
# the compile with whatever the first CUDA process on a machine pays. Here the order
# is new, old, new, old, each on its own empty kernel cache, each a first GPU
# training run timed whole, with the -v trace's per-module compile times.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
R=/tmp/r37e; mkdir -p $R
D=$PWD/dev-bin
{
for round in 1 2; do
for b in octet octet-c; do
  export OCTET_CACHE=$R/cache-$b-$round; rm -rf $OCTET_CACHE
  s=$(date +%s.%N)
  $D/$b train --device cuda --model tiny --steps 3 --no-save -v --out-dir $R/runs --name $b-$round > $R/$b-$round.txt 2> $R/$b-$round.err
  rc=$?; e=$(date +%s.%N)
  slow=$(grep -a 'kernel module' $R/$b-$round.err | sed 's/.*module="\([a-z0-9_.]*\)".*ms=\([0-9]*\).*/\2 \1/' | sort -n | tail -3 | awk '{printf "%s %.1fs, ", $2, $1/1000}')
  first_step=$(grep -a -m1 'step=1' $R/$b-$round.err | awk '{print $1}')
  echo "round $round $b: rc=$rc whole $(awk "BEGIN{printf \"%.1f\", $e-$s}") s; step 1 at ${first_step}; slowest compiles: $slow"
done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
cp $R/*.err $OUT/ 2>/dev/null
