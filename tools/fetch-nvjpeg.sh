#!/bin/sh
# Debian's CUDA toolkit has no nvJPEG. This puts nvjpeg.h and libnvjpeg.so
# from NVIDIA's nvidia-nvjpeg wheel (PyPI) into DIR/include and DIR/lib, for
# ./configure --with-nvjpeg=DIR, so that the GPU JPEG decoder compiles and
# links on machines without it (CI). The wheel matches the toolkit's major
# version: nvidia-nvjpeg 13.0.x for CUDA 13.0.
#   tools/fetch-nvjpeg.sh DIR [NVCC]
set -eu
dir=$1
nvcc=${2:-nvcc}
ver=$("$nvcc" --version | sed -n 's/.*release \([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1.\2/p')
major=${ver%%.*}
[ "$major" = 13 ] || { echo "fetch-nvjpeg: CUDA $ver: only CUDA 13's wheel (nvidia-nvjpeg 13.x) is known" >&2; exit 1; }
[ -f "$dir/include/nvjpeg.h" ] && [ -e "$dir/lib/libnvjpeg.so" ] && exit 0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "nvidia-nvjpeg==$ver.*"
python3 -m zipfile -e "$tmp"/nvidia_nvjpeg-*.whl "$tmp/x"
mkdir -p "$dir/include" "$dir/lib"
cp "$tmp"/x/nvidia/cu"$major"/include/nvjpeg.h "$dir/include/"
cp "$tmp"/x/nvidia/cu"$major"/lib/libnvjpeg.so.* "$dir/lib/"
so=$(cd "$dir/lib" && ls libnvjpeg.so.* | head -n 1)
ln -sf "$so" "$dir/lib/libnvjpeg.so"
echo "fetch-nvjpeg: nvJPEG $ver headers and library in $dir"
