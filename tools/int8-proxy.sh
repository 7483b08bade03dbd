#!/bin/bash
# INT8 against FP32 on a trained network when ImageNet weights cannot be
# had, and what each precision mix costs. tools/train-proxy trains a
# ResNet18 on the calibration photos (GPU, about a minute on an H100);
# then, on this machine's INT8 engine (DEVICE, default cuda):
#   1. resnetd-calibrate --target-agreement TARGET (default 99) searches
#      the mixes and methods on the held-out photos and writes the fastest
#      table that meets it; that table is checked again on the held-out
#      photos turned by quarter turns;
#   2. the fully INT8 entropy table, checked on both sets, beside it;
#   3. resnetd-bench: the float precision (FP16 on cuda, FP32 on cpu) and
#      INT8 at every mix, the proxy's weights, batches BATCHES (default
#      1,256), ROUNDS rounds (default 2);
#   4. tools/int8-emulate: cheaper fixes predicted on the same weights.
# The training log, the search, the checks, the benchmarks and the tables
# go to OUT; a summary is printed last.
#
# Usage: tools/int8-proxy.sh PHOTOS OUT [BUILD-DIR]
#   PHOTOS     tools/make-photos' --out (calib/ and heldout/)
#   BUILD-DIR  where resnetd-calibrate and resnetd-bench are (default .)
# Environment: TRAIN_ARGS (more train-proxy options, e.g. --steps N),
# TORCH_PYTHON (the Python with torch and torchvision; default python3),
# DEVICE, TARGET, MIXES (the mixes searched, a comma list; default all),
# BATCHES, ROUNDS, BENCH=0 (skip step 3), EMULATE=0 (skip step 4),
# TRAIN=0 (no training: OUT already holds train-proxy's weights and
# heldout-rot, e.g. from a train-proxy run beside the build).
set -u
photos=${1:?usage: tools/int8-proxy.sh PHOTOS OUT [BUILD-DIR]}
out=${2:?usage: tools/int8-proxy.sh PHOTOS OUT [BUILD-DIR]}
bin=${3:-.}
here=$(dirname "$0")
py=${TORCH_PYTHON:-python3}
dev=${DEVICE:-cuda}
batches=${BATCHES:-1,256}
mkdir -p "$out"
if [ "${TRAIN:-1}" != 0 ]; then
    # shellcheck disable=SC2086 # TRAIN_ARGS is a list of options
    PYTHONUNBUFFERED=1 "$py" "$here/train-proxy" --photos "$photos" --out "$out" ${TRAIN_ARGS:-} \
        >"$out/train.txt" 2>&1 || { cat "$out/train.txt"; exit 1; }
fi
cat "$out/train.txt"
w=$out/weights.safetensors
rc=0
# Exit 3: under the target, reported, not a failure of this script.
ok() { [ "$1" = 0 ] || [ "$1" = 3 ] || rc=1; }
cal() { "$bin/resnetd-calibrate" --weights "$w" --device "$dev" "$@"; }
{
    echo "== search: --target-agreement ${TARGET:-99} on $photos/heldout"
    cal --images "$photos/calib" --out "$out/table.json" --check "$photos/heldout" \
        --target-agreement "${TARGET:-99}" ${MIXES:+--mix "$MIXES"}
    ok $?
    echo "== the chosen table on $out/heldout-rot"
    cal --table "$out/table.json" --check "$out/heldout-rot"
    ok $?
    echo "== fully INT8, entropy"
    cal --images "$photos/calib" --method entropy --mix int8 --out "$out/table-int8.json" \
        --check "$photos/heldout"
    ok $?
    cal --table "$out/table-int8.json" --check "$out/heldout-rot"
    ok $?
} >"$out/check.txt" 2>&1
cat "$out/check.txt"
float=fp16
[ "$dev" = cpu ] && float=fp32
mixes="int8 float:stem float:layer1.0 float:layer1 float:layer2.0 float:layer2 float:layer3.0 float:layer3"
if [ "${BENCH:-1}" != 0 ]; then
    for r in $(seq "${ROUNDS:-2}"); do
        "$bin/resnetd-bench" --device "$dev" --precision "$float" --weights "$w" --batches "$batches" \
            --json >"$out/bench-float-$r.json" || rc=1
        for m in $mixes; do
            "$bin/resnetd-bench" --device "$dev" --precision int8 --weights "$w" --calibration "$out/table.json" \
                --int8-mix "$m" --batches "$batches" --json >"$out/bench-$m-$r.json" || rc=1
        done
    done
    "$bin/resnetd-bench" --device "$dev" --precision int8 --weights "$w" --calibration "$out/table.json" \
        --batches "${batches##*,}" --iters 5 --layers >"$out/layers-chosen.txt" 2>&1 || rc=1
fi
if [ "${EMULATE:-1}" != 0 ]; then
    "$py" "$here/int8-emulate" --weights "$w" --table "$out/table-int8.json" --calib "$photos/calib" \
        --check "$photos/heldout" --check "$out/heldout-rot" >"$out/emulate.txt" 2>&1 || rc=1
    cat "$out/emulate.txt"
fi
[ "${BENCH:-1}" != 0 ] && "$py" - "$out" "${ROUNDS:-2}" "$float" $mixes <<'PY'
import json, sys
out, rounds, float_name, mixes = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
def gpu(path):
    return {r["batch"]: r.get("gpu_img_per_s") or r["img_per_s"] for r in json.load(open(path))["engine"]}
print(f"\nimg/s per round (gpu where there is one), proxy weights; ratio: the same round's {float_name}")
for r in range(1, rounds + 1):
    f = gpu(f"{out}/bench-float-{r}.json")
    for b in sorted(f):
        cells = [f"{float_name} {f[b]:9.0f}"]
        for m in mixes:
            g = gpu(f"{out}/bench-{m}-{r}.json")[b]
            cells.append(f"{m} {g:9.0f} ({g / f[b]:.2f}x)")
        print(f"  round {r} b={b:<4} " + "  ".join(cells))
PY
sha256sum "$w"
exit "$rc"
