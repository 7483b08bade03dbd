#!/bin/sh
# resnetd-load against the real daemon (tests/client/test_load_daemon.py); skips
# without the reference weights.
ref=${RESNETD_REF_DIR:-}
if [ -z "$ref" ] || [ ! -f "$ref/weights.safetensors" ]; then
  echo "reference data missing: run tests/reference.py"
  [ "${RESNETD_REQUIRE_REFERENCE:-0}" = 1 ] && exit 1
  exit 77
fi
PY=/usr/bin/python3
test -x "$PY" || PY=python3
exec "$PY" "${RESNETD_SRCDIR:-$(dirname "$0")/../..}/tests/client/test_load_daemon.py"
