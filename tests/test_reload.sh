#!/bin/sh
# Hot reload of a live resnetd under load (tests/reload_client.py): SIGHUP
# and POST /v2/repository/models/resnet18/load, a failed load keeping the
# running model.
set -eu
exec sh "$RESNETD_SRCDIR/tests/run_client.sh" reload_client.py "$@"
