#!/bin/sh
# The README's two commands. On a fresh Debian machine:
#   sh tools/quickstart.sh run    install what is missing, build, fetch weights, run the daemon
#   sh tools/quickstart.sh test   install what is missing, build, run the test suite
# Builds out of tree in ./build. CUDA is used when nvcc is found
# (RESNETD_NO_CUDA=1: not, which saves nvcc's minutes where there is no GPU).
set -eu
cd "$(dirname "$0")/.."
top=$(pwd)
mode=${1:-}
case "$mode" in run|test) ;; *) echo "usage: $0 run|test" >&2; exit 2 ;; esac

build_pkgs="build-essential autoconf automake pkg-config libjansson-dev libmicrohttpd-dev
  libturbojpeg0-dev libjpeg62-turbo-dev check libsubunit-dev libopenblas-dev"
run_pkgs="curl python-matplotlib-data"
# Reference tests: torchvision on Debian's python3, cjpeg for restart-marker
# JPEGs and decode bombs, promtool and systemd-analyze for the ops checks,
# clang and its runtime (libFuzzer) for tests/fuzz, nginx for the scale-out
# test (etc/nginx; the test runs its own unprivileged nginx, but where systemd
# runs services, installing the package also starts Debian's default site),
# python3-yaml to parse etc/kubernetes, curl to run the documented examples
# (tests/api/test_doc_examples.sh), python3-venv for the Triton client
# test (tests/api/test_tritonclient.sh installs tritonclient from PyPI into a
# venv once, and skips when it cannot).
test_pkgs="curl python3-venv python3-torch python3-torchvision python3-pil python3-numpy libjpeg-turbo-progs
  python-matplotlib-data prometheus systemd gnuplot-nox clang libclang-rt-dev nginx python3-yaml"

install_missing() {
  missing=
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing="$missing $p"
  done
  [ -z "$missing" ] && return 0
  echo "quickstart: installing$missing"
  sudo=
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -q
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends $missing
}

# shellcheck disable=SC2086
if [ "$mode" = test ]; then install_missing $build_pkgs $test_pkgs; else install_missing $build_pkgs $run_pkgs; fi

conf_flags=
[ "${CI:-}" = true ] && conf_flags="--enable-werror"
# GPU JPEG decoding needs nvJPEG, which Debian's CUDA toolkit lacks: take
# its header and library from NVIDIA's wheel so the code is built (CI must
# compile it; it runs only where there is a GPU).
nvcc=$(command -v nvcc || true)
[ -z "$nvcc" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc=/usr/local/cuda/bin/nvcc
if [ -n "${RESNETD_NO_CUDA:-}" ]; then
  nvcc=
  conf_flags="$conf_flags --without-cuda"
fi
if [ -n "$nvcc" ]; then
  cuda_home=$(dirname "$(dirname "$nvcc")")
  if [ -f "$cuda_home/include/nvjpeg.h" ]; then
    :
  elif sh tools/fetch-nvjpeg.sh "$top/.nvjpeg" "$nvcc"; then
    conf_flags="$conf_flags --with-nvjpeg=$top/.nvjpeg"
  elif [ "${CI:-}" = true ]; then
    echo "quickstart: cannot fetch nvJPEG; CI must build the GPU JPEG decoder" >&2
    exit 1
  else
    echo "quickstart: no nvJPEG; building without GPU JPEG decoding" >&2
  fi
fi
if [ ! -f configure ] || [ configure.ac -nt configure ] || [ Makefile.am -nt configure ]; then
  autoreconf -fi
fi
mkdir -p build
cd build
if [ ! -f Makefile ] || [ ../configure -nt Makefile ]; then
  # shellcheck disable=SC2086
  ../configure $conf_flags
fi
jobs=$(nproc 2>/dev/null || echo 2)
if [ -n "$nvcc" ] && grep -q '^#define HAVE_CUDA 1' config.h 2>/dev/null && [ ! -f resnetd ]; then
  echo "quickstart: building the CUDA engine too ($nvcc): nvcc takes about 2-3 minutes on 2 cores" \
    "(the rest ~30 s); RESNETD_NO_CUDA=1 builds the CPU engine alone" >&2
fi
make -j"$jobs"

if [ "$mode" = test ]; then
  # In CI a missing reference (torch) is a failure, not a skip.
  [ "${CI:-}" = true ] && export RESNETD_REQUIRE_REFERENCE=1 RESNETD_REQUIRE_PROMTOOL=1 \
    RESNETD_REQUIRE_NGINX=1 RESNETD_REQUIRE_YAML=1
  if ! make -j"$jobs" check; then
    for f in tests/*/*.log; do
      grep -qE '^:test-result: (FAIL|ERROR)' "${f%.log}.trs" 2>/dev/null && { echo "=== $f"; tail -n 60 "$f"; }
    done
    exit 1
  fi
  exit 0
fi

# run: real ImageNet weights when the network allows, else synthetic ones.
mkdir -p "$top/weights"
w="$top/weights/resnet18.tv_in1k.safetensors"
if [ ! -s "$w" ]; then
  url=https://huggingface.co/timm/resnet18.tv_in1k/resolve/main/model.safetensors
  if curl -fsSL --connect-timeout 10 -o "$w.part" "$url"; then
    mv "$w.part" "$w"
  else
    rm -f "$w.part"
    echo "quickstart: could not download $url (offline?)." >&2
    echo "quickstart: using SYNTHETIC random weights: predictions are meaningless." >&2
    w=synthetic
  fi
fi
sample=/usr/share/matplotlib/mpl-data/sample_data/grace_hopper.jpg
port=${RESNETD_PORT:-8080}
cat <<MSG
quickstart: starting resnetd on 127.0.0.1:$port (Ctrl-C drains and stops it). Try:
  curl -s --data-binary @$sample -H 'Content-Type: image/jpeg' 'localhost:$port/classify?top_k=3'
  curl -s -F image=@$sample -F image=@$sample localhost:$port/classify
  curl -s localhost:$port/readyz; curl -s localhost:$port/metrics | head
MSG
exec ./resnetd --weights "$w" --listen "127.0.0.1:$port"
