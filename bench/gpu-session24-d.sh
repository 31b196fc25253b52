#!/usr/bin/env bash
# Twenty-fourth session, fourth call ($OUT set; carry dev-bin: octet = the
# cp.async small-M kernel as committed, three shapes by tokens; octet-old =
# b02d167, the register-pipelined kernel): the whole selftest, then `octet
# bench mixed` at M = 1-64 on the issue's three weights, old and new
# alternated twice (JSON kept), then decode on the ~1B model, alternated twice.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r
mkdir -p $R
run_selftest dev-bin/octet $R/selftest.txt
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin bench mixed --device cuda --m 1,2,4,8,12,16,32,64 --kn 4096x4096,4096x14336,8192x28672 \
      --json $R/mixed-$bin-$rep.json > $R/mixed-$bin-$rep.txt 2>&1
    echo "== $bin rep $rep rc=$? ($((SECONDS-t0)) s)"
    mixed_ratios $R/mixed-$bin-$rep.txt same
  done
done
for rep in 1 2; do
  for bin in octet-old octet; do
    dev-bin/$bin generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/generate-$bin-$rep.txt 2>&1
    echo "generate $bin rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$bin-$rep.txt)"
  done
done
cd $OUT && tar czf results.tgz r && rm -rf r
echo "done ($((SECONDS-t0)) s)"
