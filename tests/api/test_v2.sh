#!/bin/sh
# Open Inference Protocol v2 against a live resnetd with the CPU engine and
# the reference weights: tests/api/v2_client.py (endpoints, JSON and binary
# tensors, the three inputs, classification, errors, overload, drain, and
# equality with /classify and torchvision).
set -eu
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" api/v2_client.py "$@"
