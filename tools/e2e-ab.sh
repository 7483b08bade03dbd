#!/bin/bash
# Same-call A/B of the daemon end to end on a GPU machine: OLD (default
# 2ca644f) against NEW (default the working tree), both built in this call,
# each measured by its own tools/e2e-bench.sh on one make-corpus set, in
# rounds that alternate which tree goes first (timings from different calls
# differ by more than most changes). Prints each run's table and, last, the
# best round of each tree per connection count with the ratios new/old.
#
# From the checkout root, after `. .devdeps/device-env.sh` (../shared/GPU.md):
#   bash tools/e2e-ab.sh
# Environment: OUT (default ./e2e-ab-out), OLD (2ca644f), NEW (a revision;
# default the working tree), ROUNDS (2), CONC ("64 256 512"), DURATION (8),
# JOBS (8 a tree), DEVICE (cuda; cpu to try the script without a GPU), E2E_ARGS (extra tools/e2e-bench.sh options for both).
set -u
OUT=${OUT:-$PWD/e2e-ab-out}
OLD=${OLD:-2ca644f}
ROUNDS=${ROUNDS:-2}
CONC=${CONC:-64 256 512}
JOBS=${JOBS:-8}
work=$(mktemp -d)
mkdir -p "$OUT" "$work/old" "$work/new"
trap 'rm -rf "$work"' EXIT

git archive "$OLD" | tar -x -C "$work/old" || { echo "e2e-ab: no tree for $OLD" >&2; exit 2; }
if [ -n "${NEW:-}" ]; then
    git archive "$NEW" | tar -x -C "$work/new" || { echo "e2e-ab: no tree for $NEW" >&2; exit 2; }
else
    git ls-files -z -co --exclude-standard -- . ':!.devdeps' ':!.camera' | xargs -0 cp --parents -t "$work/new" || exit 2
fi
# Link the libjpeg whose header the build uses (device-env.sh's), as gpu-check.sh does.
ldflags=
[ -n "${LIBRARY_PATH:-}" ] && ldflags="-L${LIBRARY_PATH%%:*}"
build() {
    cd "$1" && autoreconf -fi >/dev/null 2>&1 && mkdir -p b && cd b &&
        ../configure --with-cuda LDFLAGS="$ldflags" >configure.txt 2>&1 &&
        make -j"$JOBS" resnetd resnetd-load resnetd-bench tools/make-corpus >build.txt 2>&1 ||
        { tail -20 build.txt configure.txt 2>/dev/null; echo "e2e-ab: building $1 FAILED" >&2; return 1; }
}
t0=$(date +%s)
build "$work/old" & o=$!
build "$work/new" & n=$!
wait $o && wait $n || exit 1
echo "builds: $(( $(date +%s) - t0 )) s; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1);" \
     "old = $(git rev-parse --short "$OLD"), new = ${NEW:-working tree at $(git rev-parse --short HEAD)}"
echo "old HTTP: $(ldd "$work/old/b/resnetd" | grep -c microhttpd) libmicrohttpd; new HTTP: $(ldd "$work/new/b/resnetd" | grep -c microhttpd) libmicrohttpd"
"$work/new/b/tools/make-corpus" --out "$work/corpus" --count 200 >/dev/null || exit 1

# One run: tree, round; the torchvision anchor in the first new run only.
e2e() {
    local v=$1 r=$2 anchor=--no-anchor
    [ "$v" = new ] && [ "$r" = 1 ] && [ "${DEVICE:-cuda}" != cpu ] && anchor=
    (cd "$work/$v" && bash tools/e2e-bench.sh --builddir "$work/$v/b" --device "${DEVICE:-cuda}" --corpus "$work/corpus" \
        --client-threads 4 --no-pin --concurrency "$CONC" --duration "${DURATION:-8}" $anchor \
        --out "$OUT/$v-$r" ${E2E_ARGS:-}) >"$OUT/$v-$r.txt" 2>&1
    echo "$v round $r: rc=$?"
    grep -E '^ +[0-9]+ ' "$OUT/$v-$r.txt"
}
for r in $(seq "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then e2e old "$r"; e2e new "$r"; else e2e new "$r"; e2e old "$r"; fi
done
grep -hE '^(torchvision|GPU decode-only)' "$OUT/new-1.txt"

# Per connection count: each tree's best round by img/s, and its p99 (the
# lowest p99 of its rounds, since p99 is what noise inflates).
python3 - "$OUT" "$ROUNDS" <<'PY'
import csv, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def rows(v):
    d = {}
    for r in range(1, rounds + 1):
        try:
            for row in csv.DictReader(open(f'{out}/{v}-{r}/results.tsv'), delimiter='\t'):
                d.setdefault(int(row['conc']), []).append((float(row['img_s']), float(row['p99_ms'])))
        except OSError:
            pass
    return d
old, new = rows('old'), rows('new')
print(' conc  old_img/s  new_img/s  ratio   old_p99  new_p99  ratio')
for c in sorted(old):
    if c in new:
        oi, ni = max(x[0] for x in old[c]), max(x[0] for x in new[c])
        op, np_ = min(x[1] for x in old[c]), min(x[1] for x in new[c])
        print(f'{c:5d} {oi:10.1f} {ni:10.1f} {ni / oi:6.3f} {op:9.2f} {np_:8.2f} {np_ / op:6.3f}')
PY
