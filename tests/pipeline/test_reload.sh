#!/bin/sh
# Hot reload of a live resnetd under load (tests/pipeline/reload_client.py): SIGHUP
# and POST /v2/repository/models/resnet18/load, a failed load keeping the
# running model.
set -eu
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" pipeline/reload_client.py "$@"
