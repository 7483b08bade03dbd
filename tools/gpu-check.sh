#!/bin/bash
# One call on a GPU machine (the device tool): build, the GPU tests, the
# decode path under compute-sanitizer, and the benchmarks with their
# PyTorch anchors in the same run. Logs go to $OUT (one file per stage, at
# most 8); a summary table is printed last.
#
# From the checkout root, after `. .devdeps/device-env.sh` (see
# ../shared/GPU.md):  bash tools/gpu-check.sh [tests|bench|all]   (default all)
# Environment: OUT (default ./gpu-check-out), JOBS (16), E2E_ARGS (extra
# tools/e2e-bench.sh options), SKIP_MEMCHECK=1.
set -u
what=${1:-all}
OUT=${OUT:-$PWD/gpu-check-out}
JOBS=${JOBS:-16}
mkdir -p "$OUT"
summary=$OUT/summary.txt
: >"$summary"
say() { echo "$*" | tee -a "$summary"; }

say "device: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | sort | uniq -c | tr '\n' ';')"
# Link the libjpeg whose header the build uses (device-env.sh's), not the
# machine's own: configure refuses a mismatch.
ldflags=
[ -n "${LIBRARY_PATH:-}" ] && ldflags="-L${LIBRARY_PATH%%:*}"
t0=$(date +%s)
if ! { autoreconf -fi && mkdir -p b && cd b && ../configure --with-cuda --enable-werror LDFLAGS="$ldflags" &&
       make -j"$JOBS"; } >"$OUT/build.txt" 2>&1; then
    tail -40 "$OUT/build.txt"
    say "build: FAILED (see build.txt)"
    exit 1
fi
say "build: ok in $(( $(date +%s) - t0 )) s; $(grep -h 'nvJPEG' config.log | grep -m1 NOTICE || true)"
[ -d corpus ] || ./tools/make-corpus --out corpus --count 200 >/dev/null

if [ "$what" != bench ]; then
    export RESNETD_FIDELITY_DIR=$PWD/corpus
    tests="tests/test_gpu_kernels tests/test_engine_cuda tests/test_gpu_decode tests/test_chroma_rebuild
           tests/test_batcher tests/test_daemon.sh tests/test_reload.sh tests/test_gpu_daemon.sh"
    t0=$(date +%s)
    make -j8 check TESTS="$(echo $tests)" >"$OUT/check.txt" 2>&1
    say "tests: rc=$? in $(( $(date +%s) - t0 )) s: $(grep -cE '^PASS' "$OUT/check.txt") pass, $(grep -cE '^(FAIL|ERROR)' "$OUT/check.txt") fail, $(grep -cE '^SKIP' "$OUT/check.txt") skip"
    for t in $tests; do echo "=== $t"; cat "$t.log" 2>/dev/null; done >"$OUT/tests.txt"
    grep -hE '^(fidelity|rebuild|resize)' "$OUT/tests.txt" | tee -a "$summary"
    if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
        t0=$(date +%s)
        RESNETD_GPU_TEST_QUICK=1 RESNETD_REF_DIR=$PWD/tests/ref timeout 300 \
            compute-sanitizer --tool memcheck --leak-check full ./tests/test_gpu_decode >"$OUT/memcheck.txt" 2>&1
        say "memcheck test_gpu_decode: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/memcheck.txt")"
    fi
fi

if [ "$what" != tests ]; then
    ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
    if [ "$ngpu" -gt 1 ]; then
        ./resnetd-bench --device cuda --precision fp16 --batches 256 --iters 50 --gpus all >"$OUT/gpus.txt" 2>&1
        say "$(grep '^gpus' "$OUT/gpus.txt")"
    fi
    t0=$(date +%s)
    sh ../tools/e2e-bench.sh --builddir . --device cuda --corpus corpus --client-threads 4 --no-pin --concurrency "64 256 512" \
        --out e2e-out ${E2E_ARGS:-} >"$OUT/e2e.txt" 2>&1
    say "e2e: rc=$? in $(( $(date +%s) - t0 )) s"
    grep -E '^(best e2e|e2e /|GPU decode-only|decode-only:|torchvision)' "$OUT/e2e.txt" | tee -a "$summary"
    if [ "$ngpu" -gt 1 ]; then   # the daemon on every GPU (device = cuda:all), same corpus
        sh ../tools/e2e-bench.sh --builddir . --device cuda --corpus corpus --client-threads 8 --no-pin --concurrency "256 512 1024" \
            --no-anchor --daemon-arg --device=cuda:all --out e2e-all-out ${E2E_ARGS:-} >"$OUT/e2e-all.txt" 2>&1
        say "e2e, device = cuda:all ($ngpu GPUs): $(grep -E '^best e2e' "$OUT/e2e-all.txt")"
    fi
fi
echo
cat "$summary"
