#!/usr/bin/env bash
# Fortieth session, on a 4-GPU machine if one is lent ($OUT set; carry dev-bin:
# octet.gz = HEAD). The one-GPU selftest first (HEAD carries the thirty-ninth
# session's CPU numerics fixes, never run on a GPU), then issue 7's 4-GPU figures
# with the twentieth session's script (weak scaling, peak memory, NCCL bytes).
set -uo pipefail
t0=$SECONDS
gunzip -f dev-bin/*.gz 2>/dev/null; chmod +x dev-bin/octet*
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
nvidia-smi -L
timeout 200 dev-bin/octet selftest --device cuda > $OUT/selftest.txt 2>&1
echo "selftest rc=$? ($((SECONDS-t0)) s): $(grep -a -E 'cases pass|FAIL' $OUT/selftest.txt | head -3)"
bash bench/gpu-session20-x4.sh
echo "all done ($((SECONDS-t0)) s)"
} 2>&1 | tee $OUT/summary.txt
