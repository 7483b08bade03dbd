#!/bin/sh
# Integration test of resnetd over loopback HTTP with the CPU engine and the
# reference weights: tests/daemon_client.py does the work (API, batching,
# every error status, body limits, timeouts, client_gone, overload, drain).
set -eu
ref=${RESNETD_REF_DIR:?}
if [ ! -f "$ref/weights.safetensors" ]; then
  echo "reference data missing: run tests/reference.py"
  [ "${RESNETD_REQUIRE_REFERENCE:-0}" = 1 ] && exit 1
  exit 77
fi
exec /usr/bin/python3 "$RESNETD_SRCDIR/tests/daemon_client.py" \
  --resnetd "$RESNETD_BUILDDIR/resnetd" --classify "$RESNETD_BUILDDIR/resnetd-classify" \
  --ref "$ref" --labels "$RESNETD_SRCDIR/etc/imagenet-classes.txt" \
  --promtool-check "$RESNETD_SRCDIR/tests/promtool-check.sh" "$@"
