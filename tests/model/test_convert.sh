#!/bin/sh
# tools/resnetd-convert: see tests/model/convert_check.py. Needs Debian's
# python3-torch and python3-torchvision (skip without, unless the reference
# data is required).
ref=${RESNETD_REF_DIR:?}
if ! /usr/bin/python3 -c 'import torch, torchvision, numpy' 2>/dev/null || [ ! -d "$ref/input" ]; then
  echo "torch/torchvision or the reference data missing"
  [ "${RESNETD_REQUIRE_REFERENCE:-0}" = 1 ] && exit 1
  exit 77
fi
exec /usr/bin/python3 "$RESNETD_SRCDIR/tests/model/convert_check.py" "$RESNETD_SRCDIR" "$RESNETD_BUILDDIR" "$ref"
