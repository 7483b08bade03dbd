#!/bin/sh
# Soak benchmark (not a test): mixed good, bad, half-closed, aborted and
# slow traffic against one resnetd (CPU engine, synthetic weights) for N
# minutes; prints the daemon's RSS, open fds and connections, and requests
# sent and answered every 10 s, then RSS growth after a minute of warm-up,
# the fd range, and whether every request sent was answered.
#
# Usage: tools/soak.sh [MINUTES] [JPEG]   (from the source tree, with the
#        daemon built in build/; RESNETD=path overrides)
set -eu
minutes=${1:-10}
jpeg=${2:-build/tests/ref/jpeg/s224x224.jpg}
resnetd=${RESNETD:-build/resnetd}
here=$(dirname "$0")
# shellcheck source=tools/hostile-daemon.sh
. "$here/hostile-daemon.sh"
hostile_daemon_start 2048
echo "resnetd pid $pid port $port; $(nproc) CPUs; soak for $minutes min"
/usr/bin/python3 "$here/hostile_load.py" soak --port "$port" --pid "$pid" --jpeg "$jpeg" \
    --seconds "$((minutes * 60))" --sample-s 10 --warmup-s 60 --slowloris 200 --aborts-per-s 20
