#!/bin/sh
# A legitimate client's latency while resnetd is attacked from 127.0.0.2:
# 5,000 idle sockets (connected, silent, reopened as dropped), 1,100
# slowloris connections (one header byte every 10 s, reopened when
# dropped) and 100 aborted uploads a second (headers and 1 KB of a 50 KB
# body, then close). Starts its own daemon (CPU engine, synthetic
# weights) on a free port with the default limits, and prints the
# legitimate client's (127.0.0.1) share of 200s and percentiles, the
# daemon's fds before and after, and its refusal counters. A benchmark,
# not a test.
#
# Usage: tools/slowloris-p99.sh [SECONDS] [JPEG]   (from the source tree,
#        with the daemon built in build/; RESNETD=path overrides;
#        IDLE=N, SLOWLORIS=N change the attack)
set -eu
seconds=${1:-60}
jpeg=${2:-build/tests/ref/jpeg/s224x224.jpg}
resnetd=${RESNETD:-build/resnetd}
here=$(dirname "$0")
# shellcheck source=tools/hostile-daemon.sh
. "$here/hostile-daemon.sh"
hostile_daemon_start
echo "resnetd pid $pid port $port; $(nproc) CPUs; attack for ${seconds} s"
/usr/bin/python3 "$here/hostile_load.py" p99 --port "$port" --jpeg "$jpeg" --seconds "$seconds" \
    --slowloris "${SLOWLORIS:-1100}" --aborts-per-s 100 --idle "${IDLE:-5000}" --pid "$pid"
rc=$?
curl -s "http://127.0.0.1:$port/metrics" 2>/dev/null |
    grep -E '^resnetd_(connections|slow_connections_dropped_total|requests_total\{code="(200|400|408|499)"\})' || true
exit $rc
