#!/bin/sh
# The man pages format without groff warnings, and document exactly the
# options `resnetd --help` lists (which is generated from the option table
# in daemon/config_table.c): each option appears in resnetd.conf(5) with the same
# default, and as a flag in resnetd(8); no page documents an option that
# does not exist.
set -u
builddir=${RESNETD_BUILDDIR:-.}
fail() { printf 'FAIL: %s\n' "$*"; exit 1; }

man8="$builddir/man/resnetd.8"
man5="$builddir/man/resnetd.conf.5"
[ -f "$man8" ] && [ -f "$man5" ] || fail "man pages not generated (make builds them)"

if command -v groff >/dev/null 2>&1; then
    for page in "$man8" "$man5"; do
        warnings=$(LC_ALL=C.UTF-8 groff -man -Tutf8 -ww -z "$page" 2>&1)
        [ -z "$warnings" ] || { printf '%s\n' "$warnings"; fail "groff warns about $page"; }
    done
    echo "groff: no warnings"
fi

if [ ! -x "$builddir/resnetd" ]; then
    echo "SKIP: $builddir/resnetd not built, cannot compare with --help"
    exit 77
fi
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
"$builddir/resnetd" --help >"$tmp/help" 2>&1 || fail "resnetd --help failed"

# --help prints "  --flag-name=VALUE" then "      doc (default: X)".
sed -n 's/^  --\([a-z0-9-]*\)=VALUE$/\1/p' "$tmp/help" >"$tmp/flags"
[ "$(wc -l <"$tmp/flags")" -ge 10 ] || fail "could not read the options from resnetd --help"

n=0
while read -r flag; do
    key=$(printf '%s' "$flag" | tr - _)
    def=$(sed -n "/^  --$flag=VALUE\$/{n;s/.*(default: \(.*\))\$/\1/p;}" "$tmp/help")
    # resnetd.conf(5): an entry '.BI "key = " ...' whose paragraph gives the default.
    entry=$(sed -n "/^\\.BI \"$key = \"/,/^\\.\\(TP\\|SH\\)/p" "$man5")
    [ -n "$entry" ] || fail "resnetd.conf(5) has no entry for $key"
    if [ "$def" = none ]; then want='Default: none.'; else want="Default: \\fB$def\\fP."; fi
    printf '%s\n' "$entry" | grep -qF "$want" ||
        fail "resnetd.conf(5) does not give $key's default as '$want'"
    # resnetd(8): the flag, with roff's \- for each dash.
    roff_flag=$(printf '%s' "--$flag" | sed 's/-/\\-/g')
    grep -qF ".BI $roff_flag " "$man8" || fail "resnetd(8) does not list --$flag"
    n=$((n + 1))
done <"$tmp/flags"

# Nothing documented that --help does not know.
sed -n 's/^\.BI "\([a-z0-9_]*\) = ".*/\1/p' "$man5" | while read -r key; do
    grep -qx "$(printf '%s' "$key" | tr _ -)" "$tmp/flags" ||
        { echo "FAIL: resnetd.conf(5) documents unknown option $key"; exit 1; }
done || exit 1
echo "PASS: $n options documented in both pages with their defaults"
exit 0
