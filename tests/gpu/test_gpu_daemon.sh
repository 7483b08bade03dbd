#!/bin/sh
# resnetd on the GPU with GPU JPEG decoding (tests/gpu/gpu_daemon_client.py).
# Skips (77) on a machine without an NVIDIA GPU or without nvJPEG.
set -eu
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no GPU: skipping"
  exit 77
fi
exec sh "$RESNETD_SRCDIR/tests/lib/run_client.sh" gpu/gpu_daemon_client.py "$@"
