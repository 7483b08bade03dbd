#!/bin/sh
# cpu-bench.sh: resnetd's CPU engine against PyTorch CPU, on the same cores in
# the same run, and the ratio of their img/s at each batch size.
#
#   tools/cpu-bench.sh [--precision fp32|int8] [--threads N] [--batches 1,8,32] [--iters N] [--rounds R]
#
# Each round times, per batch size, resnetd-bench --device cpu and then
# tests/reference.py --bench (torchvision resnet18, torch.inference_mode,
# torch.set_num_threads(N)); the two alternate so that load from other work
# on the machine hits both alike. With R > 1 rounds the best round of each
# side counts. --precision int8 times our INT8 engine (with a table that
# resnetd-calibrate makes from tools/make-corpus images) against PyTorch's
# quantized INT8 resnet18 (reference.py --bench --int8). Environment:
# RESNETD_BENCH (default: resnetd-bench in the build directory or on
# PATH; resnetd-calibrate and tools/make-corpus beside it for int8),
# TORCH_PYTHON (default /usr/bin/python3).
set -eu

here=$(cd "$(dirname "$0")" && pwd)
srcdir=$(dirname "$here")
threads=$(nproc)
batches=1,8,32
iters=10
rounds=1
precision=fp32
while [ $# -gt 0 ]; do
    case $1 in
    --precision) precision=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --batches) batches=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "cpu-bench.sh: unknown argument '$1'" >&2; exit 2 ;;
    esac
done

bench=${RESNETD_BENCH:-}
if [ -z "$bench" ]; then
    for b in ./resnetd-bench "$srcdir/resnetd-bench"; do
        [ -x "$b" ] && { bench=$b; break; }
    done
    [ -n "$bench" ] || bench=$(command -v resnetd-bench) || {
        echo "cpu-bench.sh: resnetd-bench not found; build it or set RESNETD_BENCH" >&2; exit 1; }
fi
py=${TORCH_PYTHON:-/usr/bin/python3}
ref=$srcdir/tests/reference.py
"$py" -c 'import torch, torchvision' 2>/dev/null || {
    echo "cpu-bench.sh: $py cannot import torch and torchvision" >&2; exit 1; }

case $precision in fp32|int8) ;; *) echo "cpu-bench.sh: --precision must be fp32 or int8" >&2; exit 2 ;; esac

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
out=$tmp/results
if [ "$precision" = int8 ]; then
    bindir=$(dirname "$bench")
    "$bindir/tools/make-corpus" --out "$tmp/corpus" --count 64 >/dev/null &&
        "$bindir/resnetd-calibrate" --weights synthetic --images "$tmp/corpus" --out "$tmp/table.json" || {
        echo "cpu-bench.sh: cannot make a calibration table with $bindir/tools/make-corpus and resnetd-calibrate" >&2
        exit 1; }
fi
# ours / theirs ARGS...: one timing of resnetd-bench / PyTorch at $precision.
ours() {
    if [ "$precision" = int8 ]; then
        "$bench" --device cpu --precision int8 --calibration "$tmp/table.json" "$@"
    else
        "$bench" --device cpu --precision fp32 "$@"
    fi
}
theirs() {
    if [ "$precision" = int8 ]; then
        "$py" -W ignore "$ref" --bench --int8 "$@"
    else
        "$py" "$ref" --bench "$@"
    fi
}
r=1
while [ "$r" -le "$rounds" ]; do
    for b in $(echo "$batches" | tr , ' '); do
        printf 'resnetd %s ' "$b" >>"$out"
        ours --threads "$threads" --batches "$b" --iters "$iters" --json >>"$out"
        printf 'torch %s ' "$b" >>"$out"
        theirs --threads "$threads" --batches "$b" --iters "$iters" >>"$out"
    done
    r=$((r + 1))
done

"$py" - "$out" "$threads" "$precision" <<'EOF'
import json, sys
best = {}
for line in open(sys.argv[1]):
    who, b, js = line.split(" ", 2)
    d = json.loads(js)
    ips = d["engine"][0]["img_per_s"] if who == "resnetd" else d["b" + b]["img_per_s"]
    key = (who, int(b))
    best[key] = max(best.get(key, 0.0), ips)
print(f"CPU, {sys.argv[2]} threads, {sys.argv[3]}: img/s (best round)")
print(f"{'batch':>6} {'resnetd':>10} {'pytorch':>10} {'ratio':>7}")
for b in sorted({b for _, b in best}):
    ours, theirs = best[("resnetd", b)], best[("torch", b)]
    print(f"{b:>6} {ours:>10.1f} {theirs:>10.1f} {ours / theirs:>7.2f}")
EOF
