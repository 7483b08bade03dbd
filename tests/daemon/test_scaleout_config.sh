#!/bin/sh
# The scale-out examples (etc/kubernetes, etc/nginx) parse and agree with
# the daemon's options and defaults: tests/daemon/scaleout_config.py. Needs
# python3-yaml: skips (77) without it, or fails under RESNETD_REQUIRE_YAML=1
# as in CI.
set -eu
if ! /usr/bin/python3 -c 'import yaml' 2>/dev/null; then
  if [ "${RESNETD_REQUIRE_YAML:-0}" = 1 ]; then
    echo "FAIL: python3-yaml missing and RESNETD_REQUIRE_YAML=1 (apt-get install python3-yaml)"
    exit 1
  fi
  echo "SKIP: python3-yaml missing (apt-get install python3-yaml)"
  exit 77
fi
exec /usr/bin/python3 "$RESNETD_SRCDIR/tests/daemon/scaleout_config.py" "$RESNETD_SRCDIR" "$RESNETD_BUILDDIR/resnetd"
