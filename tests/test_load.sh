#!/bin/sh
# resnetd-load against tests/fake_server on loopback (tests/test_load.py).
srcdir=${RESNETD_SRCDIR:-$(dirname "$0")/..}
PY=/usr/bin/python3
test -x "$PY" || PY=python3
exec "$PY" "$srcdir/tests/test_load.py"
