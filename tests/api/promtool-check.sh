#!/bin/sh
# Checks Prometheus text exposition with `promtool check metrics`.
# Usage: promtool-check.sh FILE|URL|-   (URL: http://..., fetched with curl)
# Exit: 0 clean, 1 promtool found problems (printed), 2 usage or fetch error,
# 77 promtool is missing (or 1 then, when RESNETD_REQUIRE_PROMTOOL=1).
# The daemon's integration test calls this on its /metrics.
set -u
if [ $# -ne 1 ]; then
    echo "usage: $0 FILE|URL|-" >&2
    exit 2
fi
if ! command -v promtool >/dev/null 2>&1; then
    if [ "${RESNETD_REQUIRE_PROMTOOL:-0}" = 1 ]; then
        echo "promtool-check: promtool not found and RESNETD_REQUIRE_PROMTOOL=1" >&2
        exit 1
    fi
    echo "promtool-check: promtool not found (apt-get install prometheus); skipping" >&2
    exit 77
fi
tmp=$(mktemp) || exit 2
trap 'rm -f "$tmp"' EXIT
case $1 in
    http://*|https://*)
        if ! curl -fsS --max-time 10 -o "$tmp" "$1"; then
            echo "promtool-check: cannot fetch $1" >&2
            exit 2
        fi ;;
    -) cat >"$tmp" || exit 2 ;;
    *) cp "$1" "$tmp" || exit 2 ;;
esac
if [ ! -s "$tmp" ]; then
    echo "promtool-check: empty input from $1" >&2
    exit 1
fi
# promtool prints lint problems on stdout or stderr and exits non-zero on them.
if ! out=$(promtool check metrics <"$tmp" 2>&1); then
    echo "promtool-check: $1 fails promtool check metrics:" >&2
    printf '%s\n' "$out" >&2
    exit 1
fi
if [ -n "$out" ]; then
    echo "promtool-check: promtool had something to say about $1:" >&2
    printf '%s\n' "$out" >&2
    exit 1
fi
exit 0
