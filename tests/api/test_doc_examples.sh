#!/bin/sh
# Every curl example of README.md and protocol/API.md against a live
# resnetd: tests/api/doc_examples.py.
set -eu
command -v curl >/dev/null 2>&1 || { echo "SKIP: curl not installed"; exit 77; }
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" api/doc_examples.py "$@"
