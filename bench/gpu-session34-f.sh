#!/usr/bin/env bash
# Thirty-fourth session, call f ($OUT set; carry dev-bin: octet.gz = the
# review's mend: the large-M upcast kernel calls fp8x2_to_x2 /
# fp8x2_to_x2_scaled, as the wgmma kernel does, instead of upcasting to bf16
# and converting again). Weight-only selftest on the upcast path, with the
# FP8 instructions and with the integer conversion, then the default path.
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/*
. bench/session12_runs.sh
R=/tmp/r34f; mkdir -p $R
{
for v in upcast upcast-soft default; do
  case $v in
    upcast) e="OCTET_MIXED=upcast";;
    upcast-soft) e="OCTET_MIXED=upcast OCTET_FP8_CONVERT=soft";;
    default) e="X=1";;
  esac
  env $e OCTET_SELFTEST_ONLY=mixed timeout 200 dev-bin/octet selftest --device cuda > $R/selftest-$v.txt 2>&1
  echo "selftest $v rc=$? ($((SECONDS-t0)) s): $(selftest_counts $R/selftest-$v.txt)"
  grep -a FAIL $R/selftest-$v.txt | head -5
done
echo "done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
