#!/usr/bin/env bash
# Thirty-third session, call e ($OUT set; carry dev-bin: octet.gz = 079f54a,
# bf16 x at two token groups without per-block partial sums for tensor and
# row scales). The same commands as the thirty-second session's call d: the
# full selftest, bench mixed at the issue's M on its three weights, one
# round, and decode against bf16.
exec bash "$(dirname "$0")/gpu-session32-d.sh"
