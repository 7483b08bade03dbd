#!/bin/sh
# Builds the libFuzzer targets with clang (ASan + UBSan + libFuzzer) and
# runs each for SECONDS, starting from its committed seed corpus.
#   tests/fuzz/run.sh SECONDS [TARGET...]     (default: every target)
# Targets: multipart query jpeg safetensors config v2 (HTTP parsing is
# libmicrohttpd's). Work files (binaries,
# the grown corpus, crash reproducers) go to $FUZZ_OUT (default
# ./fuzz-out); a crash stops the run with its reproducer named.
# Reproduce: $FUZZ_OUT/fuzz_TARGET $FUZZ_OUT/crash-...
set -eu
[ $# -ge 1 ] || { echo "usage: $0 SECONDS [TARGET...]" >&2; exit 2; }
secs=$1
shift
src=$(cd "$(dirname "$0")/../.." && pwd)
out=${FUZZ_OUT:-$(pwd)/fuzz-out}
cc=${FUZZ_CC:-clang}
targets=${*:-multipart query jpeg safetensors config v2}
command -v "$cc" >/dev/null || { echo "fuzz: $cc not found (apt-get install clang)" >&2; exit 1; }
mkdir -p "$out"
# engine.c includes autoconf's config.h: an empty one builds the CPU engine only.
: >"$out/config.h"
pc() { pkg-config "$@"; }
flags="-g -O1 -std=c11 -ffp-contract=off -D_POSIX_C_SOURCE=200809L -D_DEFAULT_SOURCE -fsanitize=fuzzer,address,undefined
  -fno-sanitize-recover=undefined -fno-omit-frame-pointer -I$src -I$out"

for t in $targets; do
    case $t in
    multipart|query) files="daemon/api/request.c daemon/http/budget.c util/utf8.c"; libs="-lpthread" ;;
    jpeg) files="image/preprocess.c"; libs="$(pc --libs libjpeg) -lm" ;;
    v2) files="daemon/api/v2.c daemon/http/budget.c engine/topk.c util/utf8.c"; libs="$(pc --libs jansson) -lm -lpthread" ;;
    safetensors) files="model/weights.c util/sha256.c model/resnet18.c"; libs="$(pc --libs jansson) -lm" ;;
    config) files="daemon/config_table.c util/textfile.c image/devjpeg.c engine/engine.c engine/engine_cpu.c engine/engine_cpu_int8.c engine/int8_tiles.c
                   engine/cpu_pool.c engine/calib.c util/sha256.c model/resnet18.c image/preprocess.c"
            libs="$(pc --libs libjpeg libturbojpeg jansson) $( (pc --libs openblas || pc --libs openblas-pthread) 2>/dev/null) -lm -lpthread"
            flags_extra="$( (pc --cflags openblas || pc --cflags openblas-pthread) 2>/dev/null)" ;;
    *) echo "fuzz: unknown target $t" >&2; exit 2 ;;
    esac
    paths=
    for f in $files; do paths="$paths $src/$f"; done
    echo "=== fuzz_$t: build"
    # shellcheck disable=SC2086
    $cc $flags ${flags_extra:-} -o "$out/fuzz_$t" "$src/tests/fuzz/fuzz_$t.c" $paths $libs
    flags_extra=
    mkdir -p "$out/corpus/$t"
    echo "=== fuzz_$t: ${secs}s from tests/fuzz/corpus/$t"
    # New inputs go to $out/corpus/$t; the committed seeds are only read.
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:malloc_limit_mb=2048} \
    UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
        "$out/fuzz_$t" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2560 -max_len=65536 \
        -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus/$t" "$src/tests/fuzz/corpus/$t" \
        2>"$out/fuzz_$t.log" || { tail -n 60 "$out/fuzz_$t.log"; echo "fuzz_$t: FAILED (log $out/fuzz_$t.log)"; exit 1; }
    grep -E "^stat::(number_of_executed_units|new_units_added)|^#[0-9]+ *DONE" "$out/fuzz_$t.log" || true
done
echo "fuzz: all targets ran ${secs}s without a finding"
