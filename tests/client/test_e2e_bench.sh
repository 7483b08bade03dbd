#!/bin/sh
# tools/e2e-bench.sh as a user runs it after the quickstart: from the source
# tree, with no --builddir, it must find the out-of-tree build/ (where the
# suite itself was built there; elsewhere, as in distcheck, it is given
# --builddir), finish a short CPU sweep, write its table and summary, and
# scale the plot's axis to the points measured (gnuplot where installed).
builddir=${RESNETD_BUILDDIR:-.}
srcdir=${RESNETD_SRCDIR:-..}
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
b=$(cd "$builddir" && pwd) s=$(cd "$srcdir" && pwd)
args=
[ "$b" = "$s/build" ] || args="--builddir $b"
# shellcheck disable=SC2086
if ! sh "$s/tools/e2e-bench.sh" $args --concurrency "1 2" --duration 1 --warmup 0.5 --images 6 \
        --out "$tmp/out" >"$tmp/log" 2>&1; then
    cat "$tmp/log"; echo "FAIL: e2e-bench failed"; exit 1
fi
cat "$tmp/log"
fail=0
grep -q '^best e2e:' "$tmp/out/summary.txt" || { echo "FAIL: no summary"; fail=1; }
[ "$(wc -l <"$tmp/out/results.tsv")" -eq 3 ] || { echo "FAIL: results.tsv is not a header and 2 points"; fail=1; }
if grep -q "sed: can't read" "$tmp/log"; then echo "FAIL: a sed error in the output"; fail=1; fi
if command -v gnuplot >/dev/null 2>&1; then
    [ -s "$tmp/out/e2e.png" ] || { echo "FAIL: no plot"; fail=1; }
fi
[ -z "$args" ] && echo "found the build in build/ by itself"
exit $fail
