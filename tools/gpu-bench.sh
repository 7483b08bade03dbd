#!/bin/sh
# Times the shipped CUDA engine (resnetd-bench --device cuda; FP16, FP32 and
# INT8) and PyTorch (tools/torch_anchor.py) in the same run on the GPU
# machine, and prints our img/s against PyTorch's, batch by batch, with the
# ratios.
#
# Ours "gpu" is the forward graph alone with inputs already on the GPU, as
# the anchor times PyTorch; "e2e" is submit to wait through the engine
# interface, uint8 copies in and logits out included.
#
# Usage (from the build directory): tools/gpu-bench.sh
# Environment: BATCHES (default 1,8,32,64,128,256,512), ITERS (20),
# COMPILE=1 to add torch.compile max-autotune (slow), LAYERS=1 for per-layer
# times at batches 1 and 256, OUT (where the JSON goes; default a temp dir).
set -eu
srcdir=$(cd "$(dirname "$0")/.." && pwd)
BATCHES=${BATCHES:-1,8,32,64,128,256,512}
ITERS=${ITERS:-20}
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
bench=./resnetd-bench
[ -x "$bench" ] || { echo "gpu-bench: run from the build directory (no ./resnetd-bench)" >&2; exit 2; }

$bench --device cuda --precision fp16 --batches "$BATCHES" --iters "$ITERS" --json >"$OUT/ours_fp16.json"
$bench --device cuda --precision fp32 --batches "$BATCHES" --iters "$ITERS" --json >"$OUT/ours_fp32.json"
# INT8 needs a calibration table of the bench's (synthetic) weights: made
# from 64 generated photo-like JPEGs (the scales change clamping, not speed).
[ -d "$OUT/calib-images" ] || ./tools/make-corpus --out "$OUT/calib-images" --count 64 >/dev/null
./resnetd-calibrate --weights synthetic --images "$OUT/calib-images" --out "$OUT/calib.json" >"$OUT/calib.log" 2>&1
$bench --device cuda --precision int8 --calibration "$OUT/calib.json" --batches "$BATCHES" --iters "$ITERS" \
    --json >"$OUT/ours_int8.json"
# Memory at max batch 256 (the acceptance point) and the two-slot pipeline at 64.
$bench --device cuda --precision fp16 --batches 256 --iters "$ITERS" --pipeline 64 --json >"$OUT/ours_fp16_b256.json"
if [ "${LAYERS:-0}" = 1 ]; then
    $bench --device cuda --precision fp16 --batches 1,256 --iters 5 --layers >"$OUT/layers_fp16.txt"
    $bench --device cuda --precision fp32 --batches 256 --iters 3 --layers >"$OUT/layers_fp32.txt"
    $bench --device cuda --precision int8 --calibration "$OUT/calib.json" --batches 1,256 --iters 5 --layers \
        >"$OUT/layers_int8.txt"
fi
PYTHONUNBUFFERED=1 python3 "$srcdir/tools/torch_anchor.py" --batches "$BATCHES" ${COMPILE:+--compile} \
    >"$OUT/torch.json" 2>"$OUT/torch.log"

[ "${LAYERS:-0}" = 1 ] && cat "$OUT/layers_fp16.txt" "$OUT/layers_fp32.txt" "$OUT/layers_int8.txt"
python3 - "$OUT" <<'PY'
import json, sys
out = sys.argv[1]
f16 = json.load(open(f"{out}/ours_fp16.json"))
f32 = json.load(open(f"{out}/ours_fp32.json"))
m256 = json.load(open(f"{out}/ours_fp16_b256.json"))
t = json.load(open(f"{out}/torch.json"))
def rows(j):
    return {r["batch"]: r for r in j["engine"]}
o16, o32 = rows(f16), rows(f32)
def tv(key):
    v = t.get(key)
    return v[1] if v else None
def ratio(a, b):
    return f"{a / b:5.2f}x" if a and b else "   - "
print(f"\nGPU: {t['device']}, PyTorch {t['torch']} (same run)")
print("FP16 img/s        ours gpu  ours e2e | torch eager  +graph  compile | gpu/eager gpu/best")
for b in sorted(o16):
    g = o16[b].get("gpu_img_per_s"); e = o16[b]["img_per_s"]
    eager, graph, comp = tv(f"fp16cl_b{b}"), tv(f"fp16cl_graph_b{b}"), tv(f"fp16cl_compile_b{b}")
    best = max(x for x in (eager, graph, comp) if x) if eager else None
    print(f"  b={b:<4} {g or 0:14.0f} {e:9.0f} | {eager or 0:11.0f} {graph or 0:7.0f} {comp or 0:8.0f} | "
          f"{ratio(g, eager):>9} {ratio(g, best):>8}")
o8 = rows(json.load(open(f"{out}/ours_int8.json")))
print("INT8 img/s        ours gpu  ours e2e | int8/our fp16 | int8/torch best fp16")
for b in sorted(o8):
    g = o8[b].get("gpu_img_per_s"); e = o8[b]["img_per_s"]; f = o16.get(b, {}).get("gpu_img_per_s")
    eager, graph, comp = tv(f"fp16cl_b{b}"), tv(f"fp16cl_graph_b{b}"), tv(f"fp16cl_compile_b{b}")
    best = max(x for x in (eager, graph, comp) if x) if eager else None
    print(f"  b={b:<4} {g or 0:14.0f} {e:9.0f} | {ratio(g, f):>13} | {ratio(g, best):>20}")
print("FP32 img/s        ours gpu  ours e2e | torch fp32 (no TF32)  | gpu/torch")
for b in sorted(o32):
    g = o32[b].get("gpu_img_per_s"); e = o32[b]["img_per_s"]; p = tv(f"fp32_b{b}")
    print(f"  b={b:<4} {g or 0:14.0f} {e:9.0f} | {p or 0:21.0f} | {ratio(g, p):>9}")
if 1 in o16 and t.get("fp16cl_graph_b1"):
    ours, theirs = o16[1]["gpu_ms"], t["fp16cl_graph_b1"][0]
    print(f"batch-1 latency FP16: ours {ours:.3f} ms gpu ({o16[1]['ms_per_batch']:.3f} ms e2e), "
          f"torch CUDA graph {theirs:.3f} ms: ours/torch {ours / theirs:.2f}")
mem = m256["device_memory_bytes"] / 2**20
tmem = t.get("fp16cl_peak_mem_MB_b256")
print(f"GPU memory, FP16, max batch 256: ours {mem:.0f} MiB (2 slots, all buffers)"
      + (f", torch peak {tmem:.0f} MiB: ours/torch {mem / tmem:.2f}" if tmem else ""))
p = m256.get("pipeline")
if p:
    print(f"pipeline b={p['batch']}: serial {p['serial_ms']:.3f} ms, two slots {p['overlap_ms']:.3f} ms "
          f"({p['serial_ms'] / p['overlap_ms']:.2f}x), compute alone {p['compute_ms']:.3f} ms "
          f"(two slots at {p['compute_ms'] / p['overlap_ms'] * 100:.0f}% of compute-only throughput), "
          f"{p['copy_hidden'] * 100:.0f}% of copy time hidden")
PY
echo "JSON in $OUT"
