#!/bin/bash
# Same-call A/B of the daemon end to end on a GPU machine: the trees in
# REVS (the first is the baseline; "." is the working tree), built side by
# side in this call, each measured by its own tools/e2e-bench.sh on one
# make-corpus set, in rounds that alternate the order (timings from
# different calls differ by more than most changes); VARIANTS adds runs of
# the last tree with other daemon options. Prints each run's table and,
# last, per connection count each run's best img/s and p99 with the ratios
# to the baseline. Each run's directory (results.tsv, /metrics at the end,
# the daemon's log) is packed into $OUT/runs.tar.gz.
#
# From the checkout root, after `. .devdeps/device-env.sh` (../shared/GPU.md):
#   bash tools/e2e-ab.sh
# Environment: OUT (default ./e2e-ab-out), REVS ("2ca644f ."), VARIANTS
# (';'-separated e2e-bench argument sets, e.g. "--daemon-arg
# --cpu-decode-assist=0"), ROUNDS (2), CONC ("64 256 512"), DURATION (8),
# JOBS (16 split between the trees), DEVICE (cuda; cpu to try the script
# without a GPU), E2E_ARGS (extra tools/e2e-bench.sh options for every run).
set -u
OUT=${OUT:-$PWD/e2e-ab-out}
REVS=${REVS:-2ca644f .}
ROUNDS=${ROUNDS:-2}
CONC=${CONC:-64 256 512}
DEVICE=${DEVICE:-cuda}
work=$(mktemp -d)
mkdir -p "$OUT"
trap 'rm -rf "$work"' EXIT

# Trees t0, t1, ...: a revision's tracked files, or the working tree's
# tracked and untracked (not ignored) files.
trees=()
desc=
i=0
for rev in $REVS; do
    t=t$i
    mkdir -p "$work/$t"
    if [ "$rev" = . ]; then
        git ls-files -z -co --exclude-standard -- . ':!.devdeps' ':!.camera' | xargs -0 cp --parents -t "$work/$t" || exit 2
        rev="working tree ($(git rev-parse --short HEAD 2>/dev/null)+)"
    else
        git archive "$rev" | tar -x -C "$work/$t" || { echo "e2e-ab: no tree for $rev" >&2; exit 2; }
        rev=$(git rev-parse --short "$rev")
    fi
    trees+=("$t")
    desc="$desc $t=$rev"
    i=$((i + 1))
done
[ ${#trees[@]} -gt 0 ] || { echo "e2e-ab: REVS names no tree" >&2; exit 2; }
jobs=$(( ${JOBS:-16} / ${#trees[@]} ))
[ "$jobs" -ge 1 ] || jobs=1
# Link the libjpeg whose header the build uses (device-env.sh's), as gpu-check.sh does.
ldflags=
[ -n "${LIBRARY_PATH:-}" ] && ldflags="-L${LIBRARY_PATH%%:*}"
cuda=--with-cuda
[ "$DEVICE" = cpu ] && cuda=--without-cuda
build() {
    cd "$1" && autoreconf -fi >/dev/null 2>&1 && mkdir -p b && cd b &&
        ../configure "$cuda" LDFLAGS="$ldflags" >configure.txt 2>&1 &&
        make -j"$jobs" resnetd resnetd-load resnetd-bench tools/make-corpus >build.txt 2>&1 ||
        { tail -20 build.txt configure.txt 2>/dev/null; echo "e2e-ab: building $1 FAILED" >&2; return 1; }
}
s0=$(date +%s)
pids=()
for t in "${trees[@]}"; do build "$work/$t" & pids+=($!); done
failed=0
for p in "${pids[@]}"; do wait "$p" || failed=1; done   # all of them, before the trap removes their trees
[ "$failed" = 0 ] || exit 1
echo "builds: $(( $(date +%s) - s0 )) s; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1);$desc"
for t in "${trees[@]}"; do
    echo "$t: $(ldd "$work/$t/b/resnetd" | grep -c microhttpd) libmicrohttpd"
done
"$work/${trees[0]}/b/tools/make-corpus" --out "$work/corpus" --count 200 >/dev/null || exit 1

# Runs: each tree as it is, then the last tree with each variant.
runs=()
for t in "${trees[@]}"; do runs+=("$t|"); done
last=${trees[$((${#trees[@]} - 1))]}
IFS=';'
for v in ${VARIANTS:-}; do runs+=("$last|$v"); done
unset IFS

# One run: index, round. The torchvision anchor in the first run of round 1.
e2e() {
    local k=$1 r=$2 t=${runs[$1]%%|*} args=${runs[$1]#*|} anchor=--no-anchor name=run$1-$2
    [ "$r" = 1 ] && [ "$k" = 0 ] && [ "$DEVICE" != cpu ] && anchor=
    # shellcheck disable=SC2086
    (cd "$work/$t" && bash tools/e2e-bench.sh --builddir "$work/$t/b" --device "$DEVICE" --corpus "$work/corpus" \
        --client-threads 4 --no-pin --concurrency "$CONC" --duration "${DURATION:-8}" $anchor \
        --out "$work/out/$name" ${E2E_ARGS:-} $args) >"$OUT/$name.txt" 2>&1
    echo "run $k ($t $args) round $r: rc=$?"
    grep -E '^ +[0-9]+ ' "$OUT/$name.txt"
}
n=${#runs[@]}
for r in $(seq "$ROUNDS"); do
    for k in $(seq 0 $((n - 1))); do
        [ $((r % 2)) = 0 ] && k=$((n - 1 - k))
        e2e "$k" "$r"
    done
done
grep -hE '^(torchvision|GPU decode-only|decoded by|CPU fallbacks)' "$OUT/run0-1.txt"
tar -czf "$OUT/runs.tar.gz" -C "$work/out" .

# Per connection count and run: the best round's img/s, and the lowest
# p99 of the rounds (p99 is what noise inflates); ratios to run 0.
python3 - "$work/out" "$ROUNDS" "$n" "${runs[@]}" <<'PY'
import csv, sys
out, rounds, n, labels = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def rows(k):
    d = {}
    for r in range(1, rounds + 1):
        try:
            for row in csv.DictReader(open(f'{out}/run{k}-{r}/results.tsv'), delimiter='\t'):
                d.setdefault(int(row['conc']), []).append((float(row['img_s']), float(row['p99_ms'])))
        except OSError:
            pass
    return d
res = [rows(k) for k in range(n)]
for k in range(n):
    print(f'run {k}: ' + labels[k].replace('|', ' '))
print(' conc  run      img/s  ratio   p99_ms  ratio')
for c in sorted(res[0]):
    bi, bp = max(x[0] for x in res[0][c]), min(x[1] for x in res[0][c])
    for k in range(n):
        if c in res[k]:
            i, p = max(x[0] for x in res[k][c]), min(x[1] for x in res[k][c])
            print(f'{c:5d} {k:4d} {i:10.1f} {i / bi:6.3f} {p:8.2f} {p / bp:6.3f}')
PY
