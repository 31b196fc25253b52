#!/usr/bin/env bash
# Thirty-seventh session, call h ($OUT set; carry dev-bin: octet-g.gz = eb188f9 (call
# g), octet.gz = HEAD with generate's warm-up skipping the step where nothing is
# decoded, and ck/ = a tiny checkpoint whose config says max_position_embeddings 1).
# `octet generate --max-tokens 0` on that model: the CPU prints its table; the GPU
# warm-up stepped to a second position the model does not have.
set -uo pipefail
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
{
for b in octet-g octet; do
  dev-bin/$b generate --device cuda --checkpoint dev-bin/ck --prompt R --max-tokens 0 > /tmp/$b.txt 2>&1
  echo "$b: rc=$? $(tail -2 /tmp/$b.txt | tr -s ' ' | paste -sd' ' | cut -c1-200)"
done
dev-bin/octet generate --device cuda --checkpoint dev-bin/ck --prompt RO --max-tokens 0 > /tmp/two.txt 2>&1
echo "octet, a prompt past the one position: rc=$? $(tail -1 /tmp/two.txt | cut -c1-200)"
} 2>&1 | tee $OUT/summary.txt
