#!/bin/bash
# INT8 against FP32 on a trained network when ImageNet weights cannot be
# had: tools/train-proxy trains a ResNet18 on the calibration photos (GPU,
# about a minute on an H100), then resnetd-calibrate makes an entropy and a
# percentile table from the calibration photos and checks each on the
# held-out photos and on the held-out photos turned by quarter turns.
# Prints top-1 agreement and logits rel L2; the training log, the check log
# and the tables go to OUT.
#
# Usage: tools/int8-proxy.sh PHOTOS OUT [RESNETD-CALIBRATE]
#   PHOTOS  tools/make-photos' --out (calib/ and heldout/)
#   default calibrator: ./resnetd-calibrate (a build directory's)
# Environment: TRAIN_ARGS (more train-proxy options, e.g. --steps N),
# TORCH_PYTHON (the Python with torch and torchvision; default python3).
set -u
photos=${1:?usage: tools/int8-proxy.sh PHOTOS OUT [RESNETD-CALIBRATE]}
out=${2:?usage: tools/int8-proxy.sh PHOTOS OUT [RESNETD-CALIBRATE]}
cal=${3:-./resnetd-calibrate}
here=$(dirname "$0")
mkdir -p "$out"
# shellcheck disable=SC2086 # TRAIN_ARGS is a list of options
PYTHONUNBUFFERED=1 "${TORCH_PYTHON:-python3}" "$here/train-proxy" --photos "$photos" --out "$out" ${TRAIN_ARGS:-} \
    >"$out/train.txt" 2>&1 || { cat "$out/train.txt"; exit 1; }
cat "$out/train.txt"
w=$out/weights.safetensors
rc=0
for m in entropy percentile; do
    "$cal" --weights "$w" --images "$photos/calib" --method "$m" --out "$out/table-$m.json" || { rc=1; break; }
    for d in "$photos/heldout" "$out/heldout-rot"; do
        # Exit 3: under 99%, reported, not a failure of this script.
        "$cal" --weights "$w" --table "$out/table-$m.json" --check "$d" --min-agreement 99
        r=$?
        [ "$r" = 0 ] || [ "$r" = 3 ] || rc=1
    done
done >"$out/check.txt" 2>&1
cat "$out/check.txt"
sha256sum "$w"
exit "$rc"
