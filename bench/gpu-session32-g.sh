#!/usr/bin/env bash
# Thirty-second session, call g ($OUT set; carry dev-bin: octet.gz = cf14814
# plus the few-block 16-token shape for f16 x, committed right after as
# 6e12134). The same commands as call d: the full selftest, bench mixed at
# the issue's M (1, 4, 16, 64, 256, 2048, with 2, 8 and 12) on its three
# weights, one round, and decode against bf16.
exec bash "$(dirname "$0")/gpu-session32-d.sh"
