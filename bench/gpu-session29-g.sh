#!/usr/bin/env bash
# Twenty-ninth session, call g ($OUT set; carry dev-bin, gzipped binaries:
# octet-old = 42f8c88; octet-br = call f's kernel (a source pointer a chunk,
# shared addresses stepped slot to slot; ptxas turned the row guards into
# branches); octet-nb = the same with rows past N / tokens past M zero-filled
# from a clamped row, so every copy issues, predicated, without branches).
# Call e/f: br is faster than old alone under ncu (4096x14336: 27.8 against
# 29.1-29.3 us at M = 1 and 8) but slower back to back in a graph (M = 8:
# 0.83 against 0.87 of copy) and in decode (1297 against 1326 tok/s).
# 1. weight-only selftest of nb; 2. bench mixed M = 1,8,16 on the three
# weights, old / br / nb, PDL on and off (OCTET_MIXED_PDL=0); 3. decode.
set -uo pipefail
t0=$SECONDS
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
mkdir -p /tmp/b; for b in old br nb; do gunzip -c dev-bin/octet-$b.gz > /tmp/b/octet-$b; chmod +x /tmp/b/octet-$b; done
{
OCTET_SELFTEST_ONLY=mixed /tmp/b/octet-nb selftest --device cuda > $R/selftest-nb.txt 2>&1
echo "selftest nb rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-nb.txt)"
for pdl in 1 0; do
  for b in old br nb; do
    OCTET_MIXED_PDL=$pdl /tmp/b/octet-$b bench mixed --device cuda --m 1,8,12,16 --kn 4096x4096,4096x14336,8192x28672 > $R/mixed-$b-pdl$pdl.txt 2>&1
    echo "== $b pdl $pdl rc=$? ($((SECONDS-t0)) s): $(mixed_ratios $R/mixed-$b-pdl$pdl.txt copy)"
  done
done
for rep in 1 2; do
  for b in old br nb; do
    /tmp/b/octet-$b generate --random-model 1b --device cuda --weights fp8 --compare bf16 --max-tokens 256 \
      --temperature 0 > $R/generate-$b-$rep.txt 2>&1
    echo "generate $b rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/generate-$b-$rep.txt)"
  done
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
