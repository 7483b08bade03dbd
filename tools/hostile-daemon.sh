# shellcheck shell=sh disable=SC2154,SC3045  # resnetd, jpeg: set by the sourcing script
# Sourced by tools/soak.sh and tools/slowloris-p99.sh: starts the resnetd
# they attack (CPU engine, synthetic weights, a free port) and stops it on
# exit. Needs $resnetd and $jpeg set; checks both.
#   hostile_daemon_start [CONNECTION_LIMIT]   sets $pid and $port (no limit
#   given: the default)
[ -x "$resnetd" ] || { echo "no $resnetd: build first" >&2; exit 1; }
[ -f "$jpeg" ] || { echo "no $jpeg: give a JPEG" >&2; exit 1; }
# Attack sockets and as many server ones, in one shell's processes.
ulimit -n 16384
log=$(mktemp)
trap 'kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; rm -f "$log"' EXIT

hostile_daemon_start() {
    # shellcheck disable=SC2086  # RESNETD_ARGS is a word list
    "$resnetd" --weights synthetic --device cpu --listen 127.0.0.1:0 ${1:+--connection-limit "$1"} \
        ${RESNETD_ARGS:-} >"$log" 2>&1 &
    pid=$!
    port=
    for _ in $(seq 600); do
        port=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$log")
        [ -n "$port" ] && grep -q ready "$log" && break
        sleep 0.1
    done
    [ -n "$port" ] || { cat "$log"; exit 1; }
}
