#!/bin/sh
# Runs one of the live-daemon test programs (tests/GROUP/NAME.py, whose checks go
# through daemon_client.main) against this build's resnetd and
# resnetd-classify with the reference data; skips (77) without that data,
# or fails under RESNETD_REQUIRE_REFERENCE=1. Extra arguments go to it.
#   tests/lib/run_client.sh GROUP/NAME.py [--only CHECK...] [...]
set -eu
script=$1
shift
ref=${RESNETD_REF_DIR:?}
if [ ! -f "$ref/weights.safetensors" ]; then
  echo "reference data missing: run tests/reference.py"
  [ "${RESNETD_REQUIRE_REFERENCE:-0}" = 1 ] && exit 1
  exit 77
fi
exec /usr/bin/python3 "$RESNETD_SRCDIR/tests/$script" \
  --resnetd "$RESNETD_BUILDDIR/resnetd" --classify "$RESNETD_BUILDDIR/resnetd-classify" \
  --ref "$ref" --labels "$RESNETD_SRCDIR/etc/imagenet-classes.txt" "$@"
