#!/bin/sh
# Hostile input end to end against a live resnetd (tests/http/hostile_input.py):
# decode bombs and the request deadline, non-UTF-8 bytes, NULs in the URL,
# top_k spellings, multipart quoting, hostile config and labels files.
set -eu
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" http/hostile_input.py "$@"
