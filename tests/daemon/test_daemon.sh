#!/bin/sh
# Integration test of resnetd over loopback HTTP with the CPU engine and the
# reference weights: tests/daemon/daemon_checks.py does the work (API,
# batching, every error status, body limits, timeouts, client_gone, overload,
# drain).
set -eu
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" daemon/daemon_checks.py \
  --promtool-check "$RESNETD_SRCDIR/tests/api/promtool-check.sh" "$@"
