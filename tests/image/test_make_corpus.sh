#!/bin/sh
# tools/make-corpus: with --progressive, every file must still decode
# cleanly (TurboJPEG 2.1 once corrupted the baseline image written after a
# progressive one with the same handle), the chosen share must really be
# progressive, and the baseline files must equal those of a run without it.
builddir=${RESNETD_BUILDDIR:-.}
command -v djpeg >/dev/null 2>&1 || { echo "SKIP: djpeg (libjpeg-turbo-progs) not installed"; exit 77; }
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
mc=$builddir/tools/make-corpus
"$mc" --out "$tmp/mixed" --count 12 --max-mp 0.2 --min-mp 0.05 --progressive 0.5 >/dev/null || exit 1
"$mc" --out "$tmp/plain" --count 12 --max-mp 0.2 --min-mp 0.05 >/dev/null || exit 1
fail=0 nprog=0 nsame=0
for f in "$tmp"/mixed/*.jpg; do
    b=$(basename "$f")
    if ! msg=$(djpeg -verbose -outfile /dev/null "$f" 2>&1); then
        echo "FAIL: $b does not decode"; fail=1; continue
    fi
    if echo "$msg" | grep -q "Corrupt\|Premature\|[Ww]arning"; then
        echo "FAIL: $b decodes with a warning: $(echo "$msg" | grep -m1 "Corrupt\|Premature\|[Ww]arning")"; fail=1
    fi
    if echo "$msg" | grep -q "Start Of Frame 0xc2"; then
        nprog=$((nprog + 1))
    elif cmp -s "$f" "$tmp/plain/$b"; then
        nsame=$((nsame + 1))
    else
        echo "FAIL: baseline $b differs from the run without --progressive"; fail=1
    fi
done
echo "12 files: $nprog progressive, $nsame baseline equal to the plain run"
[ "$nprog" -ge 4 ] && [ "$nprog" -le 8 ] || { echo "FAIL: $nprog progressive files for a share of 0.5"; fail=1; }
exit $fail
