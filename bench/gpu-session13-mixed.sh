#!/usr/bin/env bash
# Thirteenth session, H100 ($OUT set; carry dev-bin): the small-M weight-only
# kernel whose codes the TMA unit copies (mixed_small_tma) against the plain
# one (OCTET_MIXED_SMALL=plain), same binary, same call:
# - selftest (every mixed case; small M by both kernels);
# - `bench mixed --m 1,4,16`, single launches and back to back over distinct
#   weights, both kernels;
# - `octet generate` on the ~1B model, FP8 against bf16 weights, both kernels.
# (The TMA kernel and OCTET_MIXED_SMALL existed in the binary of this call only;
# the kernel was dropped after it: crates/octet-cuda/NOTES.md.)
set -uo pipefail
t0=$SECONDS
bin=dev-bin/octet
timeout 300 $bin selftest --device cuda > $OUT/selftest.txt 2>&1; echo "selftest rc=$? ($((SECONDS-t0)) s)"
grep -E "FAIL|cases pass" $OUT/selftest.txt | sed 's/  */ /g' | cut -c1-200 | tail -12
grep -c "plain small-M" $OUT/selftest.txt
for k in tma plain; do
  echo "== bench mixed, small-M kernel $k ($((SECONDS-t0)) s)"
  env $( [ $k = plain ] && echo OCTET_MIXED_SMALL=plain ) timeout 150 $bin bench mixed --device cuda --m 1,4,16 \
    --json $OUT/mixed-$k.json > $OUT/mixed-$k.txt 2>&1; echo "rc=$?"
  grep -E "M=|copy" $OUT/mixed-$k.txt | sed 's/  */ /g' | cut -c1-150
done
for k in tma plain; do
  echo "== generate 1b, small-M kernel $k ($((SECONDS-t0)) s)"
  env $( [ $k = plain ] && echo OCTET_MIXED_SMALL=plain ) timeout 120 $bin generate --random-model 1b --device cuda \
    --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $OUT/generate-$k.txt 2>&1; echo "rc=$?"
  grep -iE "tok|bytes" $OUT/generate-$k.txt | tail -6
done
echo "done ($((SECONDS-t0)) s)"
