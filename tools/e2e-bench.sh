#!/bin/sh
# End-to-end benchmark: starts resnetd, warms it up, sweeps client
# concurrency with resnetd-load (closed loop), prints a table, plots
# throughput vs p99 latency (gnuplot, PNG), and sets the best e2e img/s
# against decode-only img/s on the same corpus, the same cores and the same
# number of decode threads (resnetd-bench --decode-only): for CPU-decoded
# JPEGs decoding is the ceiling, so this ratio says how close the daemon gets.
# On CUDA it also measures, in the same run, the GPU decode-only ceiling
# (resnetd-bench --decode gpu: nvJPEG hardware decode + resize/crop into the
# engine slot) and PyTorch's anchor (tools/torchvision_decode_anchor.py:
# torchvision.io.decode_jpeg on the GPU, with and without resize + crop),
# and sets the e2e figure against the GPU ceiling and against the mixed
# ceiling: what the GPU and the decode threads together can decode of this
# corpus (the files the hardware refuses only on the CPU), decode-only. The
# summary splits the images by path (/metrics: decoded by the hardware, on
# the CPU by reason).
#
# Pinning: with 4 or more CPUs the daemon and the decode-only bench share
# CPUs 0..N-2 and resnetd-load gets CPU N-1, so the comparison is on the same
# cores and the client does not steal from them (--no-pin to turn off).
#
#   tools/e2e-bench.sh                          # CPU engine, synthetic corpus
#   tools/e2e-bench.sh --device cuda --out e2e  # on a GPU machine
#   tools/e2e-bench.sh --replot e2e             # the PNG again, where gnuplot is
set -eu

usage() {
  cat <<EOF
usage: tools/e2e-bench.sh [options]
  --device D            cpu, cuda, cuda:N (default cpu)
  --weights F           weights file or 'synthetic' (default synthetic)
  --corpus DIR          JPEGs to send (default: generate with make-corpus)
  --images N            images to generate when no --corpus (default 200)
  --concurrency "LIST"  closed-loop connections to sweep
                        (default cpu: "1 2 4 8 16", cuda: "8 16 32 64 128 256 512")
  --images-per-request K  multipart with K images per request (default 1: raw)
  --duration S          measured seconds per point (default 10)
  --warmup S            warm-up seconds per point (default 2)
  --threads N           daemon decode threads = decode-only threads
                        (default: the daemon's CPUs)
  --client-threads N    resnetd-load threads (default 1)
  --builddir DIR        where resnetd, resnetd-load, resnetd-bench are (default: this tree,
                        or its build/ as tools/quickstart.sh makes it)
  --out DIR             results: table, JSON per point, PNG (default e2e-out)
  --no-pin              do not pin the daemon and the client to separate CPUs
  --daemon-arg ARG      extra resnetd option (repeatable), e.g. --daemon-arg --max-batch-size=64
  --decode MODE         the daemon's JPEG decoding: auto, gpu, gpu-exact, cpu (default auto)
  --no-anchor           CUDA: skip the torchvision GPU decode anchor
  --replot DIR          only draw DIR/e2e.png again from an earlier run's DIR/results.tsv
EOF
}

# The PNG from $out/results.tsv and the values in $out/meta.env.
plot() {
  # shellcheck disable=SC1091
  . "$out/meta.env"
  if ! command -v gnuplot >/dev/null; then
    echo "e2e-bench: gnuplot not found (Debian: gnuplot-nox): no plot; later: $0 --replot $out" >&2
    return 0
  fi
  # The axis fits the measured points; the decode-only ceiling is drawn
  # when it lies within twice the best throughput (else the title says it).
  xmax=$(awk -v a="$best_ips" -v b="$decode_ips" 'BEGIN { print 1.1 * (b <= 2 * a && b > a ? b : a) }')
  ceiling=$(awk -v a="$best_ips" -v b="$decode_ips" 'BEGIN { print (b <= 2 * a) ? 1 : 0 }')
  gnuplot <<EOF
set terminal pngcairo size 900,600 noenhanced
set output "$out/e2e.png"
set title "resnetd $device: throughput vs latency (closed loop, labels: connections)\ndecode-only ceiling $decode_ips img/s, $threads threads"
set xlabel "throughput (img/s)"
set ylabel "latency (ms)"
set xrange [0:$xmax]
set logscale y
set grid
set key bottom right
$([ "$ceiling" = 1 ] && printf '%s\n' "set arrow from $decode_ips, graph 0 to $decode_ips, graph 1 nohead dt 2 lc rgb \"gray40\"" \
  "set label \"decode-only\" at $decode_ips, graph 0.95 right offset -0.5,0")
plot "$out/results.tsv" using 3:6 skip 1 with linespoints pt 7 title "p99", \
     "$out/results.tsv" using 3:4 skip 1 with linespoints pt 6 title "p50", \
     "$out/results.tsv" using 3:6:1 skip 1 with labels offset 1,1 notitle
EOF
  echo "plot: $out/e2e.png"
}

here=$(cd "$(dirname "$0")/.." && pwd)
device=cpu weights=synthetic corpus='' images=200 conc='' k=1 duration=10 warmup=2 threads=''
client_threads=1 builddir=$here out=e2e-out pin=1 daemon_args='' decode=auto anchor=1
while [ $# -gt 0 ]; do
  case $1 in
    --device) device=$2; shift ;;
    --weights) weights=$2; shift ;;
    --corpus) corpus=$2; shift ;;
    --images) images=$2; shift ;;
    --concurrency) conc=$2; shift ;;
    --images-per-request) k=$2; shift ;;
    --duration) duration=$2; shift ;;
    --warmup) warmup=$2; shift ;;
    --threads) threads=$2; shift ;;
    --client-threads) client_threads=$2; shift ;;
    --builddir) builddir=$2; shift ;;
    --out) out=$2; shift ;;
    --no-pin) pin=0 ;;
    --daemon-arg) daemon_args="$daemon_args $2"; shift ;;
    --decode) decode=$2; shift ;;
    --no-anchor) anchor=0 ;;
    --replot) out=$(cd "$2" && pwd); plot; exit 0 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "e2e-bench: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
case $device in cpu) : "${conc:=1 2 4 8 16}" ;; *) : "${conc:=8 16 32 64 128 256 512}" ;; esac

# The quickstart builds out of tree in build/.
[ "$builddir" = "$here" ] && [ ! -x "$here/resnetd" ] && [ -x "$here/build/resnetd" ] && builddir=$here/build
for b in resnetd resnetd-load resnetd-bench make-corpus; do
  p=$builddir/$b
  [ "$b" = make-corpus ] && p=$builddir/tools/make-corpus
  [ -x "$p" ] || { echo "e2e-bench: $p not built (make first)" >&2; exit 1; }
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

# --- CPUs: the daemon and decode-only share these; the client gets its own --
ncpu=$(nproc)
daemon_pin='' client_pin=''
if [ "$pin" = 1 ] && [ "$ncpu" -ge 4 ] && command -v taskset >/dev/null; then
  daemon_cpus="0-$((ncpu - 2))"
  daemon_pin="taskset -c $daemon_cpus"
  client_pin="taskset -c $((ncpu - 1))"
  daemon_ncpu=$((ncpu - 1))
else
  daemon_cpus="all"
  daemon_ncpu=$ncpu
fi
: "${threads:=$daemon_ncpu}"

# --- corpus ------------------------------------------------------------------
if [ -z "$corpus" ]; then
  corpus=$out/corpus
  if [ "$(find "$corpus" -maxdepth 1 -name '*.jpg' 2>/dev/null | wc -l)" -lt "$images" ]; then
    "$builddir/tools/make-corpus" --out "$corpus" --count "$images"
  fi
fi
ncorpus=$(find "$corpus" -maxdepth 1 \( -iname '*.jpg' -o -iname '*.jpeg' \) | wc -l)
[ "$ncorpus" -gt 0 ] || { echo "e2e-bench: no JPEGs in $corpus" >&2; exit 1; }
corpus_mb=$(du -sm "$corpus" | cut -f1)

# A number from resnetd-load's indented --json: jget FILE SECTION KEY
# (SECTION "" for top-level keys).
jget() {
  awk -v sec="$2" -v key="$3" '
    /^  "[^"]*": \{/ { s = $1; gsub(/[":]/, "", s); next }
    /^  [}]/ { s = "" }
    {
      k = $1; gsub(/[":,]/, "", k)
      if (k == key && (sec == "" ? s == "" : s == sec)) { v = $2; gsub(/,/, "", v); print v; exit }
    }' "$1"
}

# --- decode-only ceiling -----------------------------------------------------
echo "decode-only: $ncorpus images, $threads threads, CPUs $daemon_cpus"
$daemon_pin "$builddir/resnetd-bench" --decode-only --decode-dir "$corpus" --decode-threads "$threads" --iters 3 --json \
  >"$out/decode-only.json"
decode_ips=$(sed -n 's/.*"img_per_s":\([0-9.e+-]*\).*/\1/p' "$out/decode-only.json")
[ -n "$decode_ips" ] || { echo "e2e-bench: no img_per_s in $out/decode-only.json" >&2; exit 1; }
echo "decode-only: $decode_ips img/s"

# --- GPU decode-only ceiling and PyTorch's anchor (CUDA) -----------------------
gpu_decode_ips='' mixed_ips=''
tv_decode='' tv_resize='' tv_files=''
if [ "$device" != cpu ] && [ "$decode" != cpu ]; then
  bench_decode=gpu
  [ "$decode" = gpu-exact ] && bench_decode=gpu-exact
  if "$builddir/resnetd-bench" --device "$device" --decode-only --decode "$bench_decode" --decode-dir "$corpus" \
      --decode-threads "$threads" --iters 3 --json \
      >"$out/gpu-decode-only.json" 2>"$out/gpu-decode-only.err"; then
    gpu_decode_ips=$(sed -n 's/.*"img_per_s":\([0-9.e+-]*\).*/\1/p' "$out/gpu-decode-only.json")
    gpu_refused=$(sed -n 's/.*"refused":\([0-9]*\).*/\1/p' "$out/gpu-decode-only.json")
    mixed_ips=$(sed -n 's/.*"mixed_img_per_s":\([0-9.e+-]*\).*/\1/p' "$out/gpu-decode-only.json")
    echo "GPU decode-only: $gpu_decode_ips img/s ($gpu_refused of $ncorpus files refused by the hardware)"
    echo "mixed decode-only ceiling (GPU + $threads CPU threads, as the daemon decodes): $mixed_ips img/s"
  else
    echo "GPU decode-only: not available: $(tail -n 1 "$out/gpu-decode-only.err")"
  fi
  if [ "$anchor" = 1 ] && command -v python3 >/dev/null; then
    python3 "$here/tools/torchvision_decode_anchor.py" "$corpus" >"$out/torchvision-decode.json" 2>&1 || true
    tv_decode=$(sed -n 's/.*"decode_img_per_s": \([0-9.e+-]*\).*/\1/p' "$out/torchvision-decode.json")
    tv_resize=$(sed -n 's/.*"decode_resize_crop_img_per_s": \([0-9.e+-]*\).*/\1/p' "$out/torchvision-decode.json")
    tv_files=$(sed -n 's/.*"gpu_decodable": \([0-9]*\).*/\1/p' "$out/torchvision-decode.json")
    echo "torchvision GPU anchor: decode $tv_decode img/s, decode + resize + crop $tv_resize img/s" \
      "(the $tv_files of $ncorpus files it decodes on the GPU)"
  fi
fi

# --- daemon ------------------------------------------------------------------
log=$out/resnetd.log
# Made here: the background job's 2> may open it after the first read below.
: >"$log"
# The load generator is one address: no per-address limit (where the
# daemon has one; e2e-ab.sh runs older trees too).
"$builddir/resnetd" --help 2>/dev/null | grep -q -- --client-connection-limit &&
  daemon_args="--client-connection-limit 0 $daemon_args"
# shellcheck disable=SC2086  # daemon_pin and daemon_args are word lists
$daemon_pin "$builddir/resnetd" --weights "$weights" --device "$device" --listen 127.0.0.1:0 \
  --labels "$here/etc/imagenet-classes.txt" --decode-threads "$threads" --decode "$decode" $daemon_args 2>"$log" &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT INT TERM
port=
i=0
while [ $i -lt 600 ]; do
  if ! kill -0 $daemon 2>/dev/null; then
    echo "e2e-bench: resnetd exited:" >&2; cat "$log" >&2; exit 1
  fi
  port=$(sed -n 's/.*(port \([0-9]*\)).*/\1/p' "$log" | head -n1)
  if [ -n "$port" ] && grep -q '\bready\b' "$log"; then break; fi
  sleep 0.2
  i=$((i + 1))
done
if [ -z "$port" ] || ! grep -q '\bready\b' "$log"; then
  echo "e2e-bench: resnetd not ready after 120 s" >&2
  exit 1
fi
url=http://127.0.0.1:$port/classify
echo "resnetd: $(grep -m1 'listening' "$log" | sed 's/^resnetd: //')"

kargs=
[ "$k" -gt 1 ] && kargs="-k $k"
top=$(echo "$conc" | awk '{print $NF}')
echo "warm-up: $top connections, 5 s"
# shellcheck disable=SC2086
$client_pin "$builddir/resnetd-load" -q -u "$url" -c "$top" -t "$client_threads" $kargs -d 5 --no-metrics \
  "$corpus" >/dev/null

# --- sweep -------------------------------------------------------------------
tsv=$out/results.tsv
printf 'conc\treq_s\timg_s\tp50_ms\tp90_ms\tp99_ms\tp999_ms\tsent\tok\tlost\terrors\tmean_batch\tqueue_ms\tdecode_ms\tserver_cores\tclient_cores\n' >"$tsv"
printf '%6s %8s %8s %8s %8s %8s %8s %7s %5s %6s %6s %6s %7s %7s %6s\n' conc req/s img/s p50_ms p90_ms p99_ms \
  p99.9_ms sent lost errors batch queue decode server client
for c in $conc; do
  j=$out/load-c$c.json
  t=$client_threads
  [ "$t" -gt "$c" ] && t=$c
  # shellcheck disable=SC2086
  $client_pin "$builddir/resnetd-load" --json -q -u "$url" -c "$c" -t "$t" $kargs -d "$duration" \
    --warmup "$warmup" "$corpus" >"$j"
  ok=$(jget "$j" requests ok) answered=$(jget "$j" requests answered)
  line=$(printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s' "$c" \
    "$(jget "$j" throughput req_per_s)" "$(jget "$j" throughput img_per_s)" \
    "$(jget "$j" latency_ms p50)" "$(jget "$j" latency_ms p90)" "$(jget "$j" latency_ms p99)" \
    "$(jget "$j" latency_ms p99.9)" "$(jget "$j" requests sent)" "$ok" "$(jget "$j" requests lost)" \
    "$((answered - ok))" "$(jget "$j" server mean_batch_size)" "$(jget "$j" server mean_queue_ms)" \
    "$(jget "$j" server mean_decode_ms)" "$(jget "$j" server cpu_cores)" "$(jget "$j" client_cpu cores)")
  echo "$line" >>"$tsv"
  echo "$line" | awk -F'\t' '{ printf "%6d %8.1f %8.1f %8.2f %8.2f %8.2f %8.2f %7d %5d %6d %6.2f %6.2f %7.2f %7.2f %6.2f\n",
    $1, $2, $3, $4, $5, $6, $7, $8, $10, $11, $12, $13, $14, $15, $16 }'
done

curl -s "http://127.0.0.1:$port/metrics" >"$out/metrics-final.txt" 2>/dev/null || true
# Non-2xx answers by status, per point (resnetd-load's http_status).
errors_by_status=$(for c in $conc; do
  awk -v c="$c" '/^  "http_status": \{/ { on = 1; next } on && /^  [}]/ { on = 0 }
    on { k = $1; v = $2; gsub(/[":,]/, "", k); gsub(/,/, "", v); if (k !~ /^2/ && v > 0) s = s " " k ": " v }
    END { if (s != "") print "non-2xx answers at " c " connections:" s }' "$out/load-c$c.json"
done)
kill -TERM $daemon
wait $daemon || true
trap - EXIT INT TERM

# The best point, and where its CPU time went: the daemon's CPUs are the
# budget; decode-only spends threads/decode_ips CPU-seconds per image.
best=$(awk -F'\t' 'NR > 1 && $3 > b { b = $3; c = $1 } END { printf "%s %s", b, c }' "$tsv")
best_ips=${best% *} best_c=${best#* }
ratio=$(awk -v a="$best_ips" -v b="$decode_ips" 'BEGIN { printf "%.3f", a / b }')
client_where="any CPU"
[ -n "$client_pin" ] && client_where="CPU $((ncpu - 1))"
{
  echo "device $device, weights $weights, corpus $corpus ($ncorpus images, $corpus_mb MB), $k image(s)/request"
  echo "daemon CPUs $daemon_cpus ($daemon_ncpu), $threads decode threads; client on $client_where"
  echo "decode-only: $decode_ips img/s ($threads threads, same CPUs)"
  [ -n "$gpu_decode_ips" ] && echo "GPU decode-only: $gpu_decode_ips img/s (nvJPEG hardware + resize/crop, $bench_decode)"
  [ -n "$mixed_ips" ] && echo "mixed decode-only ceiling: $mixed_ips img/s (the GPU and $threads CPU threads together)"
  [ -n "$tv_resize" ] && echo "torchvision GPU anchor: decode $tv_decode img/s, decode + resize + crop $tv_resize img/s" \
    "(the $tv_files of $ncorpus files it decodes on the GPU)"
  echo "daemon: $(grep -m1 'listening' "$log" | sed 's/.*JPEG decoding on the /JPEG decoding on the /')"
  echo "best e2e:    $best_ips img/s at $best_c connections"
  echo "e2e / decode-only = $ratio"
  if [ -n "$gpu_decode_ips" ]; then
    awk -v a="$best_ips" -v b="$gpu_decode_ips" 'BEGIN { printf "e2e / GPU decode-only = %.3f\n", a / b }'
  fi
  if [ -n "$mixed_ips" ]; then
    awk -v a="$best_ips" -v b="$mixed_ips" 'BEGIN { printf "e2e / mixed decode-only ceiling = %.3f\n", a / b }'
  fi
  if [ -n "$tv_resize" ]; then
    awk -v a="$best_ips" -v b="$tv_resize" 'BEGIN { printf "e2e / torchvision GPU decode + resize + crop = %.2f\n", a / b }'
  fi
  [ -n "$errors_by_status" ] && echo "$errors_by_status"
  sed -n 's/^resnetd_decoded_images_total{backend="\([a-z]*\)"} \([0-9]*\)/decoded by \1: \2/p; s/^resnetd_decode_fallbacks_total{reason="\([a-z_]*\)"} \([1-9][0-9]*\)/CPU fallbacks, \1: \2/p' \
    "$out/metrics-final.txt" 2>/dev/null || true
  awk -F'\t' -v c="$best_c" -v n="$daemon_ncpu" -v t="$threads" -v d="$decode_ips" 'NR > 1 && $1 == c {
    printf "where the time went at %s connections: the daemon used %.2f of %d CPUs (%.2f idle);\n", c, $15, n, n - $15
    printf "  %.2f ms CPU per image, of which decode %.2f ms (decode-only: %.2f ms per image per thread);\n",
      1e3 * $15 / $3, $14, 1e3 * t / d
    printf "  the rest, %.2f ms: HTTP, hand-offs, JSON, and on the CPU engine the inference itself\n", 1e3 * $15 / $3 - $14
  }' "$tsv"
} | tee "$out/summary.txt"

cat >"$out/meta.env" <<EOF
device='$device' decode_ips='$decode_ips' threads='$threads' best_ips='$best_ips'
EOF
plot
