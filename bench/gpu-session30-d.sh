#!/usr/bin/env bash
# Thirtieth session, call d ($OUT set; carry dev-bin: octet.gz = the new
# attention kernel (per-warp softmax state, keys and values loaded together,
# a one-pass merge) and sampling on the device (`GpuDecoder::generate`);
# octet-old.gz = HEAD b66d250 with bench/session30-ablate.patch, which with
# OCTET_ABLATE unset runs the same kernels as HEAD).
# 1. the full selftest of the new build;
# 2. decode of the ~1B model, 256 tokens, greedy, FP8 beside bf16: old, new
#    with --host-sampling (the attention alone), new (attention + sampling on
#    the device), two rounds in turn;
# 3. the same text: new with and without --host-sampling at T 0.8, top-k 40;
# 4. 1800 tokens, FP8: old, new.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz
. bench/session12_runs.sh
R=$OUT/r; mkdir -p $R
text_md5() { awk '/^weights  matrix bytes/{exit} {print}' "$1" | md5sum | cut -c1-12; }
{
dev-bin/octet selftest --device cuda > $R/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest.txt)"
grep -a "decode .* model\|sample on\|FAIL" $R/selftest.txt | sed 's/   */ /g'
G="generate --random-model 1b --device cuda"
for rep in 1 2; do
  for v in old new-host new; do
    case $v in
      old) cmd="dev-bin/octet-old $G" ;;
      new-host) cmd="dev-bin/octet $G --host-sampling" ;;
      new) cmd="dev-bin/octet $G" ;;
    esac
    $cmd --weights fp8 --compare bf16 --max-tokens 256 --temperature 0 > $R/g-$v-$rep.txt 2>&1
    echo "$v rep $rep rc=$? ($((SECONDS-t0)) s): $(generate_rows $R/g-$v-$rep.txt) text $(text_md5 $R/g-$v-$rep.txt)"
  done
done
for v in new-host new; do
  extra=""; [ $v = new-host ] && extra=--host-sampling
  dev-bin/octet $G $extra --weights fp8 --max-tokens 256 --temperature 0.8 --top-k 40 > $R/t-$v.txt 2>&1
  echo "T 0.8 $v rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/t-$v.txt | tail -1) text $(text_md5 $R/t-$v.txt)"
done
for v in old new; do
  [ $SECONDS -gt 520 ] && break
  b=dev-bin/octet; [ $v = old ] && b=dev-bin/octet-old
  $b $G --weights fp8 --max-tokens 1800 --temperature 0 > $R/l-$v.txt 2>&1
  echo "1800 tokens $v rc=$? ($((SECONDS-t0)) s): $(grep -a -A2 'matrix bytes' $R/l-$v.txt | tail -1)"
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $R/summary.txt
