#!/bin/sh
# A legitimate client's latency while resnetd is attacked: 1,100 slowloris
# connections (one header byte every 10 s, reopened when dropped) and 100
# aborted uploads a second (headers and 1 KB of a 50 KB body, then close).
# Starts its own daemon (CPU engine, synthetic weights) on a free port with
# room for the attack (connection_limit 4096) and prints the legitimate
# client's percentiles. A benchmark, not a test.
#
# Usage: tools/slowloris-p99.sh [SECONDS] [JPEG]   (from the source tree,
#        with the daemon built in build/; RESNETD=path overrides)
set -eu
seconds=${1:-60}
jpeg=${2:-build/tests/ref/jpeg/s224x224.jpg}
resnetd=${RESNETD:-build/resnetd}
here=$(dirname "$0")
# shellcheck source=tools/hostile-daemon.sh
. "$here/hostile-daemon.sh"
hostile_daemon_start 4096
echo "resnetd pid $pid port $port; $(nproc) CPUs; attack for ${seconds} s"
/usr/bin/python3 "$here/hostile_load.py" p99 --port "$port" --jpeg "$jpeg" --seconds "$seconds" \
    --slowloris 1100 --aborts-per-s 100
rc=$?
curl -s "http://127.0.0.1:$port/metrics" 2>/dev/null |
    grep -E '^resnetd_(connections|slow_connections_dropped_total|requests_total\{code="(200|408|499)"\})' || true
exit $rc
