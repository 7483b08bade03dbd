#!/bin/sh
# tools/make-camera-corpus: every file decodes without a warning, and its
# headers are what manifest.tsv says: the layout's sampling factors (4:4:0
# is luma 1x2), a restart interval where one is listed, SOF2 where
# progressive, an Adobe marker for CMYK, Exif APP1 and ICC APP2 where
# listed; the mix has every layout and both restart and plain files. A
# second run with the same seed writes the same bytes. Then
# tools/decode-fidelity on 2-3 MP files: DCT-scaled decoding (decode = gpu's
# CPU decodes) moves each group's crops by at most 1 level on average.
# Skips (77) when the photo packages cannot be fetched, outside CI.
set -u
bin=${RESNETD_BUILDDIR:?}
src=${RESNETD_SRCDIR:?}
py=${TORCH_PYTHON:-/usr/bin/python3}
command -v djpeg >/dev/null 2>&1 || { echo "SKIP: djpeg (libjpeg-turbo-progs) not installed"; exit 77; }
"$py" -c 'import numpy, PIL' 2>/dev/null || { echo "SKIP: $py lacks numpy or PIL"; exit 77; }
tmp=$(mktemp -d) || exit 99
trap 'rm -rf "$tmp"' EXIT
cache=$bin/tests/photos/.cache
mkdir -p "$cache"
"$py" "$src/tools/make-camera-corpus" --out "$tmp/a" --count 28 --classes web --cache "$cache"
rc=$?
if [ "$rc" = 2 ] && [ "${RESNETD_REQUIRE_REFERENCE:-0}" != 1 ]; then
    echo "SKIP: the photo packages could not be fetched: no network or apt lists?"
    exit 77
fi
[ "$rc" = 0 ] || { echo "FAIL: make-camera-corpus exited $rc"; exit 1; }
"$py" "$src/tools/make-camera-corpus" --out "$tmp/b" --count 28 --classes web --cache "$cache" >/dev/null || exit 1
for f in "$tmp"/a/*.jpg; do
    cmp -s "$f" "$tmp/b/$(basename "$f")" || { echo "FAIL: $(basename "$f") differs between two runs"; exit 1; }
    msg=$(djpeg -outfile /dev/null "$f" 2>&1) || { echo "FAIL: $(basename "$f") does not decode: $msg"; exit 1; }
    [ -z "$msg" ] || { echo "FAIL: $(basename "$f") decodes with: $msg"; exit 1; }
done
"$py" - "$tmp/a" <<'PY' || exit 1
import sys

def segments(data):
    """(marker, payload) of every segment before the first scan."""
    i, out = 2, []
    while i + 4 <= len(data) and data[i] == 0xFF:
        m = data[i + 1]
        n = int.from_bytes(data[i + 2:i + 4], "big")
        out.append((m, data[i + 4:i + 2 + n]))
        if m == 0xDA:
            break
        i += 2 + n
    return out

want_sampling = {"420": [(2, 2), (1, 1), (1, 1)], "422": [(2, 1), (1, 1), (1, 1)],
                 "440": [(1, 2), (1, 1), (1, 1)], "444": [(1, 1)] * 3, "411": [(4, 1), (1, 1), (1, 1)],
                 "grey": [(1, 1)]}
d = sys.argv[1]
rows = [l.rstrip("\n").split("\t") for l in open(d + "/manifest.tsv")][1:]
layouts, restarts = set(), 0
for name, cls, w, h, layout, restart, prog, exif, icc, nbytes in rows:
    data = open("%s/%s" % (d, name), "rb").read()
    assert len(data) == int(nbytes), name
    seg = segments(data)
    markers = [m for m, _ in seg]
    sof = [(m, p) for m, p in seg if m in (0xC0, 0xC1, 0xC2)]
    assert len(sof) == 1, (name, markers)
    m, p = sof[0]
    assert (m == 0xC2) == (prog == "1"), (name, hex(m), prog)
    assert (int.from_bytes(p[3:5], "big"), int.from_bytes(p[1:3], "big")) == (int(w), int(h)), name
    comps = [((p[7 + 3 * i] >> 4), (p[7 + 3 * i] & 15)) for i in range(p[5])]
    if layout == "cmyk":
        assert len(comps) == 4 and any(m == 0xEE and pl.startswith(b"Adobe") for m, pl in seg), (name, comps)
    else:
        assert comps == want_sampling[layout], (name, layout, comps)
    dri = [int.from_bytes(pl[:2], "big") for m, pl in seg if m == 0xDD]
    assert (dri[0] if dri else 0) == int(restart), (name, dri, restart)
    assert any(m == 0xE1 and pl.startswith(b"Exif\0\0") for m, pl in seg) == (exif == "1"), name
    assert any(m == 0xE2 and pl.startswith(b"ICC_PROFILE\0") for m, pl in seg) == (icc == "1"), name
    layouts.add(layout)
    restarts += restart != "0"
assert layouts == set(want_sampling) | {"cmyk"}, layouts
assert 0 < restarts < len(rows), restarts
print("%d files: headers as listed; layouts %s; %d with restart intervals" % (len(rows), sorted(layouts), restarts))
PY

"$py" "$src/tools/make-camera-corpus" --out "$tmp/mid" --count 8 --classes 2-3mp --cache "$cache" >/dev/null || exit 1
"$py" "$src/tools/decode-fidelity" --classify "$bin/resnetd-classify" --weights synthetic --corpus "$tmp/mid" \
    --max-mean 1.0 || { echo "FAIL: scaled decoding moved a group's crops by more than 1 level on average"; exit 1; }
