#!/bin/bash
# One call on a GPU machine (the device tool): build, the GPU tests, the
# decode path and the conv kernels under compute-sanitizer, and the
# benchmarks with their PyTorch anchors in the same run. Logs go to $OUT
# (one file per stage, at most 8); a summary table is printed last.
#
# From the checkout root, after `. .devdeps/device-env.sh` (see
# ../shared/GPU.md):  bash tools/gpu-check.sh [tests|bench|engine|sanitize|mixed|all|STAGE,STAGE...]
#   tests   the GPU tests, memcheck (decode path), racecheck (conv kernels)
#   bench   end to end through HTTP with the GPU decode path and its anchors
#   engine  the engine alone, FP16/INT8/FP32, with PyTorch eager, CUDA graph and
#           torch.compile max-autotune at batch 256 (~3 min)
#   sanitize  memcheck of the kernel tests (every tile, the stem, INT8) and
#           of the INT8 engine test (~3 min; not part of all)
#   mixed   end to end on the baseline corpus and on corpora with a share
#           of progressive JPEGs (MIXED, default "0.10 0.25"), which the
#           CPU decodes (~4 min; not part of all)
#   camera  camera photos: for each corpus in CAMERA (directories from
#           tools/make-camera-corpus, relative to the checkout; default
#           .camera/mixed) the GPU decode fidelity per size class and
#           layout, then end to end with the mixed ceiling and the
#           torchvision anchor (CAMERA_FIDELITY=0: e2e only); then
#           make-corpus size classes CAMERA_MP (default "2-3 10-13") end
#           to end (not part of all; on an H200 each corpus takes 60-125 s
#           of e2e at three concurrencies, the 12 MP class the longest, so
#           a call of the build and four corpora outlasts the 600 s limit)
#   all     tests, bench and engine (default; ~7 min on an H100)
# Environment: OUT (default ./gpu-check-out), JOBS (16), E2E_ARGS (extra
# tools/e2e-bench.sh options), SKIP_MEMCHECK=1, SKIP_RACECHECK=1, RACE_TILES (the racecheck's
# tiles, as RESNETD_GPU_TEST_TILES: all of them outlast its 200 s),
# CAMERA_ARENAS (MiB list: the camera stage's GPU decode-only rate of each
# make-corpus class with each gpu_decode_memory),
# GPU_TESTS (the tests stage's list), REBUILD=0 (make in the b/ an earlier
# call on the same machine configured), BATCHES (the engine stage's, default
# 256), COMPILE= (the engine stage without torch.compile).
set -u
what=${1:-all}
# A comma list of stages runs each: bench,mixed
run() {
    case ",$what," in *",$1,"*) return 0 ;; esac
    [ "$what" = all ] && [ "$1" != mixed ] && [ "$1" != sanitize ] && [ "$1" != camera ]
}
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
# REBUILD=0: a later call on the same machine, b/ configured already
if [ "${REBUILD:-1}" = 0 ] && [ -f b/Makefile ]; then
    build() { cd b && make -j"$JOBS"; }
else
    build() { autoreconf -fi && mkdir -p b && cd b && ../configure --with-cuda --enable-werror LDFLAGS="$ldflags" &&
              make -j"$JOBS"; }
fi
if ! build >"$OUT/build.txt" 2>&1; then
    tail -40 "$OUT/build.txt"
    say "build: FAILED (see build.txt)"
    exit 1
fi
say "build: ok in $(( $(date +%s) - t0 )) s; $(grep -h 'nvJPEG' config.log | grep -m1 NOTICE || true)"
[ -d corpus ] || ./tools/make-corpus --out corpus --count 200 >/dev/null

if run tests; then
    export RESNETD_FIDELITY_DIR=$PWD/corpus
    tests=${GPU_TESTS:-"tests/gpu/test_gpu_kernels tests/gpu/test_gpu_ops tests/gpu/test_engine_cuda tests/gpu/test_gpu_decode tests/image/test_chroma_rebuild
           tests/pipeline/test_batcher tests/daemon/test_daemon.sh tests/pipeline/test_reload.sh tests/gpu/test_gpu_daemon.sh"}
    t0=$(date +%s)
    make -j8 check TESTS="$(echo $tests)" >check.txt 2>&1
    say "tests: rc=$? in $(( $(date +%s) - t0 )) s: $(grep -cE '^PASS' check.txt) pass, $(grep -cE '^(FAIL|ERROR)' check.txt) fail, $(grep -cE '^SKIP' check.txt) skip"
    { cat check.txt; for t in $tests; do echo "=== $t"; cat "$t.log" 2>/dev/null; done; } >"$OUT/tests.txt"
    grep -hE '^(fidelity|rebuild|resize)' "$OUT/tests.txt" | tee -a "$summary"
    if [ "${SKIP_MEMCHECK:-0}" != 1 ]; then
        t0=$(date +%s)
        RESNETD_GPU_TEST_QUICK=1 RESNETD_REF_DIR=$PWD/tests/ref timeout 300 \
            compute-sanitizer --tool memcheck --leak-check full ./tests/gpu/test_gpu_decode >"$OUT/memcheck.txt" 2>&1
        say "memcheck test_gpu_decode: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 "$OUT/memcheck.txt")"
    fi
    if [ "${SKIP_MEMCHECK:-0}" != 1 ] && [ "${SKIP_RACECHECK:-0}" != 1 ]; then
        t0=$(date +%s)
        RESNETD_GPU_TEST_QUICK=1 RESNETD_GPU_TEST_TILES=${RACE_TILES:-} timeout 200 \
            compute-sanitizer --tool racecheck ./tests/gpu/test_gpu_kernels >racecheck.txt 2>&1
        say "racecheck test_gpu_kernels: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 racecheck.txt)"
        { echo "=== racecheck test_gpu_kernels"; cat racecheck.txt; } >>"$OUT/memcheck.txt"
    fi
fi

if run sanitize; then
    # The conv, stem and INT8 kernels (every tile) and the INT8 engine under
    # memcheck (small shapes and batches; the engine with the cost model's
    # plans, so that memcheck sees the graphs, not thousands of timings).
    make -j"$JOBS" tests/gpu/test_gpu_kernels tests/gpu/test_gpu_ops tests/gpu/test_engine_cuda tests/ref/.stamp \
        >sanitize-build.txt 2>&1 ||
        say "sanitize: building the tests FAILED (see sanitize-build.txt)"
    t0=$(date +%s)
    RESNETD_GPU_TEST_QUICK=1 timeout 250 compute-sanitizer --tool memcheck --leak-check full ./tests/gpu/test_gpu_kernels \
        >sanitize.txt 2>&1
    say "memcheck test_gpu_kernels: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 sanitize.txt)"
    t0=$(date +%s)
    RESNETD_GPU_TEST_QUICK=1 timeout 250 compute-sanitizer --tool memcheck --leak-check full ./tests/gpu/test_gpu_ops \
        >sanitize-ops.txt 2>&1
    say "memcheck test_gpu_ops: rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 sanitize-ops.txt)"
    t0=$(date +%s)
    RESNETD_GPU_TEST_QUICK=1 RESNETD_GPU_TUNING=autotune=off CK_RUN_CASE=int8 RESNETD_REF_DIR=$PWD/tests/ref timeout 250 \
        compute-sanitizer --tool memcheck --leak-check full ./tests/gpu/test_engine_cuda >sanitize-engine.txt 2>&1
    say "memcheck test_engine_cuda (int8): rc=$? in $(( $(date +%s) - t0 )) s: $(tail -1 sanitize-engine.txt)"
    cat sanitize.txt sanitize-ops.txt sanitize-engine.txt >"$OUT/sanitize.txt"
fi

ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
if run engine; then
    t0=$(date +%s)
    BATCHES=${BATCHES:-256} COMPILE=${COMPILE-1} LAYERS=1 OUT=$PWD/gpu-bench-out sh ../tools/gpu-bench.sh >"$OUT/engine.txt" 2>&1
    say "engine: rc=$? in $(( $(date +%s) - t0 )) s"
    grep -A3 -E '^FP16 img/s|^INT8 img/s|^FP32 img/s' "$OUT/engine.txt" | grep -E 'img/s|b=' | tee -a "$summary"
    if [ "$ngpu" -gt 1 ]; then
        ./resnetd-bench --device cuda --precision fp16 --batches 256 --iters 50 --gpus all >gpus.txt 2>&1
        cat gpus.txt >>"$OUT/gpus.txt"
        say "$(grep '^gpus' gpus.txt)"
    fi
fi

if run bench; then
    t0=$(date +%s)
    sh ../tools/e2e-bench.sh --builddir . --device cuda --corpus corpus --client-threads 4 --no-pin --concurrency "64 256 512" \
        --out e2e-out ${E2E_ARGS:-} >"$OUT/e2e.txt" 2>&1
    say "e2e: rc=$? in $(( $(date +%s) - t0 )) s"
    grep -E '^(best e2e|e2e /|GPU decode-only|decode-only:|torchvision)' "$OUT/e2e.txt" | tee -a "$summary"
    if [ "$ngpu" -gt 1 ]; then   # the daemon on every GPU (device = cuda:all), same corpus
        sh ../tools/e2e-bench.sh --builddir . --device cuda --corpus corpus --client-threads 8 --no-pin --concurrency "256 512 1024" \
            --no-anchor --daemon-arg --device=cuda:all --out e2e-all-out ${E2E_ARGS:-} >e2e-all.txt 2>&1
        cat e2e-all.txt >>"$OUT/gpus.txt"
        say "e2e, device = cuda:all ($ngpu GPUs): $(grep -E '^best e2e' e2e-all.txt)"
    fi
fi
if run mixed; then
    # Progressive files take the CPU fallback: the full-speed baseline
    # corpus and, in the same call, corpora with each share progressive.
    for share in 0 ${MIXED:-0.10 0.25}; do
        dir=corpus
        if [ "$share" != 0 ]; then
            dir=corpus-p$share
            [ -d "$dir" ] || ./tools/make-corpus --out "$dir" --count 200 --progressive "$share" >/dev/null
        fi
        t0=$(date +%s)
        sh ../tools/e2e-bench.sh --builddir . --device cuda --corpus "$dir" --client-threads 4 --no-pin \
            --concurrency "256 512" --no-anchor --out "e2e-mixed-$share" >mixed.txt 2>&1
        rc=$?
        { echo "=== progressive share $share"; cat mixed.txt; } >>"$OUT/mixed.txt"
        say "mixed, progressive share $share: rc=$rc in $(( $(date +%s) - t0 )) s: $(grep -E '^best e2e' mixed.txt)"
        grep -E '^(decoded by|CPU fallbacks)' mixed.txt | tr '\n' ';' | tee -a "$summary"
        echo | tee -a "$summary"
    done
fi
if run camera; then
    root=$(cd .. && pwd)
    cam=$OUT/camera.txt
    : >"$cam"
    # cam_e2e LABEL CORPUS OUTDIR PREFIX: e2e-bench on a corpus, its log
    # into camera.txt, its figures into the summary (t0: the stage's start).
    cam_e2e() {
        sh ../tools/e2e-bench.sh --builddir . --device cuda --corpus "$2" --client-threads 4 --no-pin \
            --concurrency "${CAMERA_CONC:-64 512}" --duration "${CAMERA_DURATION:-8}" --out "$3" \
            ${E2E_ARGS:-} >e2e-cam.txt 2>&1
        rc=$?
        { echo "=== e2e $1 (rc=$rc)"; cat e2e-cam.txt; } >>"$cam"
        say "$1: e2e rc=$rc in $(( $(date +%s) - t0 )) s"
        grep -E '^( +[0-9]+ |best e2e|e2e /|GPU decode-only|mixed decode-only|decode-only:|torchvision|decoded by|CPU fallbacks|non-2xx)' \
            e2e-cam.txt | sed "s/^/$4: /" | tee -a "$summary"
    }
    for d in ${CAMERA:-.camera/mixed}; do
        name=$(basename "$d")
        t0=$(date +%s)
        if [ "${CAMERA_FIDELITY:-1}" = 1 ]; then   # both GPU modes against the CPU path
            # the tests stage builds these; a camera-only call must too
            make -j"$JOBS" tests/gpu/test_gpu_decode tests/ref/.stamp >/dev/null 2>&1
            RESNETD_FIDELITY_DIR=$root/$d CK_RUN_CASE=fidelity RESNETD_REF_DIR=$PWD/tests/ref \
                ./tests/gpu/test_gpu_decode >fid.txt 2>&1
            echo "=== fidelity $name (rc=$?)" >>"$cam"
            cat fid.txt >>"$cam"
            grep -E '^fidelity gpu(-exact)? [0-9a-z-]+mp|^fidelity gpu(-exact)? (web|directory)|^100%|Failures: [1-9]' \
                fid.txt | sed "s/^/$name: /" | tee -a "$summary"
        fi
        cam_e2e "camera $name" "$root/$d" "e2e-$name" "$name"
    done
    for mp in ${CAMERA_MP-2-3 10-13}; do
        dir=corpus-mp$mp
        [ -d "$dir" ] || ./tools/make-corpus --out "$dir" --count 40 --min-mp "${mp%-*}" --max-mp "${mp#*-}" >/dev/null
        for mib in ${CAMERA_ARENAS:-}; do   # the GPU decode-only rate by arena size (MiB)
            ./resnetd-bench --device cuda --decode-only --decode gpu --decode-dir "$dir" --iters 3 --json \
                --decode-memory "$mib" >arena.json 2>&1
            say "$mp MP: GPU decode-only with gpu_decode_memory ${mib}M: $(sed -n 's/.*"img_per_s":\([0-9.e+-]*\).*/\1/p' arena.json) img/s"
        done
        t0=$(date +%s)
        cam_e2e "make-corpus $mp MP" "$dir" "e2e-mp$mp" "$mp MP"
    done
fi
echo
cat "$summary"
