#!/bin/sh
# The text metrics_render() produces, empty and filled, passes
# `promtool check metrics`; a broken exposition is rejected by the same check,
# so a silently passing promtool cannot hide a bad render.
set -u
builddir=${RESNETD_BUILDDIR:-.}
srcdir=${RESNETD_SRCDIR:-.}
check="$srcdir/tests/api/promtool-check.sh"
dump="$builddir/tests/api/metrics_dump"
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT

"$dump" --empty >"$tmp/empty.prom" || { echo "FAIL: metrics_dump --empty"; exit 1; }
"$dump" >"$tmp/filled.prom" || { echo "FAIL: metrics_dump"; exit 1; }

"$check" "$tmp/empty.prom"
rc=$?
[ $rc -eq 77 ] && exit 77
[ $rc -eq 0 ] || { echo "FAIL: empty metrics rejected by promtool"; exit 1; }
"$check" "$tmp/filled.prom" || { echo "FAIL: filled metrics rejected by promtool"; exit 1; }

# Negative control: a counter without _total and a sample with no TYPE.
sed 's/^resnetd_images_total /resnetd_images /; s/^# TYPE resnetd_images_total counter/# TYPE resnetd_images counter/; s/^# HELP resnetd_images_total /# HELP resnetd_images /' \
    "$tmp/filled.prom" >"$tmp/bad.prom"
if "$check" "$tmp/bad.prom" 2>/dev/null; then
    echo "FAIL: promtool accepted a counter without _total"
    exit 1
fi
grep -q '^resnetd_batch_size_bucket{le="+Inf"} ' "$tmp/filled.prom" ||
    { echo "FAIL: no batch-size +Inf bucket"; exit 1; }
echo "PASS: $(grep -c -v '^#' "$tmp/filled.prom") samples pass promtool"
exit 0
