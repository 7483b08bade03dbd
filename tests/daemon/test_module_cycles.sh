#!/bin/sh
# No dependency loop between modules (a .c and its header) in daemon/,
# engine/, image/, model/, util/, gpu/, client/ and tools/ (subfolders
# included): tools/module-cycles reads the includes
# and calls. A loop fails the test and is named.
set -u
srcdir=${RESNETD_SRCDIR:-.}
command -v python3 >/dev/null 2>&1 || { echo "no python3"; exit 77; }
out=$(python3 "$srcdir/tools/module-cycles" "$srcdir") || { printf '%s\n' "$out"; echo "FAIL: dependency loops"; exit 1; }
printf '%s\n' "$out"
