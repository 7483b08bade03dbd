#!/bin/sh
# The real Triton client (tritonclient[http] from PyPI) against a live
# resnetd: tests/api/tritonclient_v2.py. The client is installed once into a
# venv beside Debian's python3 (whose numpy it uses), kept in the user's
# cache so later runs and builds reuse it; exits 77 (skip) when it can be
# neither imported nor installed (offline, no python3-venv).
set -eu
venv=${RESNETD_TRITON_VENV:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/resnetd/tritonclient-venv}
probe='import tritonclient.http, numpy'
if ! "$venv/bin/python" -c "$probe" 2>/dev/null; then
  echo "installing tritonclient[http] into $venv"
  if ! { mkdir -p "$(dirname "$venv")" &&
         /usr/bin/python3 -m venv --system-site-packages "$venv" &&
         "$venv/bin/pip" install -q --disable-pip-version-check 'tritonclient[http]' &&
         "$venv/bin/python" -c "$probe"; }; then
    echo "tritonclient[http] cannot be installed or imported: skipping"
    exit 77
  fi
fi
ref=${RESNETD_REF_DIR:?}
if [ ! -f "$ref/weights.safetensors" ]; then
  echo "reference data missing: run tests/reference.py"
  [ "${RESNETD_REQUIRE_REFERENCE:-0}" = 1 ] && exit 1
  exit 77
fi
exec "$venv/bin/python" "$RESNETD_SRCDIR/tests/api/tritonclient_v2.py" \
  --resnetd "$RESNETD_BUILDDIR/resnetd" --classify "$RESNETD_BUILDDIR/resnetd-classify" \
  --ref "$ref" --labels "$RESNETD_SRCDIR/etc/imagenet-classes.txt" "$@"
