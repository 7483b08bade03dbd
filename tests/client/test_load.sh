#!/bin/sh
# resnetd-load against tests/client/fake_server on loopback (tests/client/test_load.py).
srcdir=${RESNETD_SRCDIR:-$(dirname "$0")/../..}
PY=/usr/bin/python3
test -x "$PY" || PY=python3
exec "$PY" "$srcdir/tests/client/test_load.py"
