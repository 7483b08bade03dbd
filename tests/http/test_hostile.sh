#!/bin/sh
# Hostile-client tests of resnetd's connection layer over loopback:
# tests/http/hostile_client.py does the work (aborted uploads, slowloris,
# half-closed clients, a second daemon on the port, signals, drain during
# long decodes, the HTTP layer's own errors, body framing, body memory).
set -eu
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" http/hostile_client.py "$@"
