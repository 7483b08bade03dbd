#!/bin/bash
# Same-call A/B of the engine on a GPU machine: BASE (default HEAD) as
# "old" against the working tree as "new", both built in this call, so
# that the two are timed on one GPU minutes apart (timings from different
# calls differ by more than most changes). Then the new tree's kernel and
# engine tests, each tree's op-by-op layer times with the autotuner's log,
# and interleaved rounds of resnetd-bench; a table of what changed last.
#
# From the checkout root, after `. .devdeps/device-env.sh` (../shared/GPU.md):
#   bash tools/gpu-ab.sh
# Environment: OUT (default ./gpu-ab-out), BASE (HEAD), ROUNDS (3),
# PRECISIONS ("int8 fp16"), AB_BATCHES ("1,256"), VARIANTS (argument sets
# for the new tree's extra rounds, ';'-separated), TESTS (1; 0 skips the
# tests), JOBS (8 a tree),
# SANITIZE_TILES (after the tests: the new tree's kernel test under
# memcheck and racecheck for the tiles whose names contain it, as
# RESNETD_GPU_TEST_TILES, and the INT8 engine test under memcheck at its
# quick batches, 1-17; a sanitizer's error is rc 99).
set -u
OUT=${OUT:-$PWD/gpu-ab-out}
BASE=${BASE:-HEAD}
ROUNDS=${ROUNDS:-3}
PRECISIONS=${PRECISIONS:-int8 fp16}
JOBS=${JOBS:-8}
root=$PWD
work=$(mktemp -d)
mkdir -p "$OUT" "$work/old" "$work/new"
trap 'rm -rf "$work"' EXIT

# old: BASE's tracked files; new: the working tree's tracked and untracked
# (not ignored) files, as the change stands.
git archive "$BASE" | tar -x -C "$work/old" || { echo "gpu-ab: no tree for $BASE" >&2; exit 2; }
git ls-files -z -co --exclude-standard -- . ':!.devdeps' | xargs -0 cp --parents -t "$work/new" || exit 2
git diff "$BASE" >"$OUT/change.diff"
# Link the libjpeg whose header the build uses (device-env.sh's), as gpu-check.sh does.
ldflags=
[ -n "${LIBRARY_PATH:-}" ] && ldflags="-L${LIBRARY_PATH%%:*}"
build() {  # tree extra-targets...
    local tree=$1
    shift
    cd "$tree" && autoreconf -fi >/dev/null 2>&1 && mkdir -p b && cd b &&
        ../configure --with-cuda LDFLAGS="$ldflags" >/dev/null &&
        make -j"$JOBS" resnetd-bench resnetd-calibrate tools/make-corpus "$@" >build.txt 2>&1 ||
        { tail -20 build.txt; echo "gpu-ab: building $tree FAILED" >&2; return 1; }
}
t0=$(date +%s)
# Only the new tree's tests run (the old tree's may live elsewhere).
build "$work/old" & o=$!
build "$work/new" tests/gpu/test_gpu_kernels tests/gpu/test_gpu_ops tests/gpu/test_engine_cuda & n=$!
wait $o && wait $n || exit 1
echo "builds: $(( $(date +%s) - t0 )) s; $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1); old = $(git rev-parse --short "$BASE")"

# One calibration table for both trees (the scales move clamping, not speed).
cd "$work/new/b" || exit 1
./tools/make-corpus --out calib-images --count 64 >/dev/null &&
    ./resnetd-calibrate --weights synthetic --images calib-images --out "$work/calib.json" >/dev/null 2>&1 ||
    { echo "gpu-ab: calibration FAILED" >&2; exit 1; }

if [ "${TESTS:-1}" = 1 ]; then
    make tests/ref/.stamp >/dev/null 2>&1
    t0=$(date +%s)
    CK_FORK=no timeout 300 ./tests/gpu/test_gpu_kernels >"$OUT/kernels.txt" 2>&1
    echo "kernel tests (new): rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/kernels.txt")"
    t0=$(date +%s)
    CK_FORK=no timeout 200 ./tests/gpu/test_gpu_ops >"$OUT/ops.txt" 2>&1
    echo "ops tests (new): rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/ops.txt")"
    t0=$(date +%s)
    RESNETD_REF_DIR=$PWD/tests/ref CK_FORK=no timeout 200 ./tests/gpu/test_engine_cuda >"$OUT/engine-test.txt" 2>&1
    echo "engine test (new): rc=$? in $(( $(date +%s) - t0 )) s: $(grep -E '^[0-9]+%' "$OUT/engine-test.txt" | tail -1)"
fi
if [ -n "${SANITIZE_TILES:-}" ]; then
    make tests/ref/.stamp >/dev/null 2>&1
    for tool in memcheck racecheck; do
        t0=$(date +%s)
        RESNETD_GPU_TEST_QUICK=1 RESNETD_GPU_TEST_TILES=$SANITIZE_TILES CK_FORK=no timeout 200 \
            compute-sanitizer --tool $tool --error-exitcode 99 ./tests/gpu/test_gpu_kernels >"$OUT/$tool-kernels.txt" 2>&1
        echo "$tool kernel tests ($SANITIZE_TILES): rc=$? in $(( $(date +%s) - t0 )) s:" \
            "$(tail -1 "$OUT/$tool-kernels.txt")"
    done
    t0=$(date +%s)
    RESNETD_GPU_TEST_QUICK=1 RESNETD_GPU_TUNING=autotune=off CK_RUN_CASE=int8 RESNETD_REF_DIR=$PWD/tests/ref CK_FORK=no \
        timeout 200 compute-sanitizer --tool memcheck --leak-check full --error-exitcode 99 ./tests/gpu/test_engine_cuda \
        >"$OUT/memcheck-engine.txt" 2>&1
    echo "memcheck engine test (int8): rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/memcheck-engine.txt")"
fi

bench() {  # tree precision extra-args...
    local v=$1 p=$2
    shift 2
    (cd "$work/$v/b" && ./resnetd-bench --device cuda --precision "$p" --calibration "$work/calib.json" "$@")
}
# The autotuner's log: --gpu-tuning where the tree has it, else (trees
# before it) the environment variable it replaced.
autotune_log() {  # tree
    if (cd "$work/$1/b" && ./resnetd-bench --help | grep -q -- --gpu-tuning); then echo "--gpu-tuning autotune=log"; fi
}
for v in old new; do
    for p in $PRECISIONS; do
        # shellcheck disable=SC2046
        RESNETD_GPU_AUTOTUNE=log bench $v $p --batches 256 --iters 20 --layers $(autotune_log $v) \
            >"$OUT/layers-$p-$v.txt" 2>&1
    done
done
# Graphed gpu figures: ms at b=1, img/s at each larger batch (AB_BATCHES),
# the two trees in turn, then the new tree with each of VARIANTS' argument
# sets (';'-separated, e.g. "--deterministic").
gpu_figures() {
    awk '$1 ~ /^[0-9]+$/ { if ($1 == 1) printf " b1_gpu_ms %s", $5; else printf " b%s_gpu_img/s %s", $1, $6 }
         END { print "" }'
}
for r in $(seq "$ROUNDS"); do
    for v in old new; do
        for p in $PRECISIONS; do
            echo "$v $p$(bench $v $p --batches "${AB_BATCHES:-1,256}" --iters 50 2>/dev/null | gpu_figures)"
        done
    done
    IFS=';'
    for args in ${VARIANTS:-}; do
        unset IFS
        for p in $PRECISIONS; do
            # shellcheck disable=SC2086
            echo "new$args $p$(bench new $p --batches "${AB_BATCHES:-1,256}" --iters 50 $args 2>/dev/null | gpu_figures)"
        done
        IFS=';'
    done
    unset IFS
done | tee "$OUT/rounds.txt"

# Ops whose time moved by more than 0.002 ms or whose tile changed.
python3 - "$OUT" $PRECISIONS <<'PY'
import re, sys
out, precisions = sys.argv[1], sys.argv[2:]
def layers(path):
    d, on = {}, False
    for line in open(path):
        if line.startswith('layers at batch 256'):
            on = True
        elif on and re.match(r'\s+\S+\s+[0-9.]+ ms', line):
            f = line.split()
            d[f[0]] = (float(f[1]), ' '.join(f[4:]))
    return d
for p in precisions:
    a, b = layers(f'{out}/layers-{p}-old.txt'), layers(f'{out}/layers-{p}-new.txt')
    print(f'{p}, op by op at b=256 (ms: old new new-old, tiles):')
    for k in a:
        if k in b and (a[k][1] != b[k][1] or abs(b[k][0] - a[k][0]) > 0.002):
            print(f'  {k:24s} {a[k][0]:.3f} {b[k][0]:.3f} {b[k][0] - a[k][0]:+.3f}  {a[k][1]} -> {b[k][1]}')
    print(f'  total {sum(x[0] for x in a.values()):.3f} {sum(x[0] for x in b.values()):.3f}')
PY
cd "$root" || true
