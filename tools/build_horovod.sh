#!/usr/bin/env bash
# Builds Horovod 0.28.1 from its sdist, with the patches the pins name, as a wheel in
# dist/ for one venv's TensorFlow and flavour; tools/setup.sh installs it from there.
#
#   VENV=.venv TF=2.21 TF_FLAVOR=cpu tools/build_horovod.sh version   the wheel's version
#   VENV=.venv TF=2.21 TF_FLAVOR=cpu tools/build_horovod.sh wheel     build it (unless in dist/)
#
# The version names what the build holds, so a wheel is only reused for the same build:
# 0.28.1+hvdmnist.<sha256 of the patches, 8>.tf<TensorFlow>.<cpu|gpu>[.mpi].
# Patches come from "# horovod-patch: NAME" lines of tools/pins/tf<TF>.txt, then of
# tools/pins/tf<TF>-gpu.txt for TF_FLAVOR=gpu (tools/horovod-patches/NAME; why:
# docs/horovod.md). MPI is built in where `mpirun` is Open MPI.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
TF=${TF:-2.21}
TF_FLAVOR=${TF_FLAVOR:-cpu}
DIST=${DIST:-$ROOT/dist}
HOROVOD_VERSION=0.28.1
PY=$VENV/bin/python
PIP=("$PY" -m pip --disable-pip-version-check)

pins=("$ROOT/tools/pins/tf$TF.txt")
[ "$TF_FLAVOR" = cpu ] || pins+=("$ROOT/tools/pins/tf$TF-$TF_FLAVOR.txt")
patches=()
while read -r name; do patches+=("$name"); done < <(sed -n 's/^# horovod-patch: //p' "${pins[@]}")

with_mpi() { command -v mpirun >/dev/null && mpirun --version 2>/dev/null | grep -qi 'open mpi'; }

wheel_version() {
  local tf_version patches_hash
  tf_version=$("$PY" -c 'from importlib.metadata import version; print(version("tensorflow"))' \
               2>/dev/null || "$PY" -c 'from importlib.metadata import version; print(version("tensorflow-cpu"))')
  # /dev/null: with no patches, cat must not read stdin.
  patches_hash=$(cd "$ROOT/tools/horovod-patches" && cat "${patches[@]}" /dev/null | sha256sum | cut -c1-8)
  echo "$HOROVOD_VERSION+hvdmnist.$patches_hash.tf$tf_version.$TF_FLAVOR$(with_mpi && echo .mpi)"
}

# The wheel in dist/ for this build and this venv's Python, if there is one.
existing_wheel() {
  local python_tag
  python_tag=$("$PY" -c 'import sys; print("cp%d%d" % sys.version_info[:2])')
  { compgen -G "$DIST/horovod-$1-$python_tag-*.whl" || true; } | head -n 1
}

# The GPU flavour compiles Horovod's kernels with clang against the venv's CUDA 12 and
# NCCL wheels, laid out as a toolkit (tools/cuda_toolkit.py; cuda-clang.patch).
gpu_build_env() {
  local site_packages toolkit=$VENV/cuda-toolkit
  if ! command -v clang++-16 >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends clang-16
    else
      echo "build_horovod: the GPU build needs clang++-16 (Debian: apt-get install clang-16)" >&2
      return 1
    fi
  fi
  site_packages=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  rm -rf "$toolkit"
  "$PY" "$ROOT/tools/cuda_toolkit.py" "$site_packages" "$toolkit"
  export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}
  export HOROVOD_CUDA_COMPILER=${HOROVOD_CUDA_COMPILER:-$(command -v clang++-16)}
  export HOROVOD_CUDA_HOME=$toolkit HOROVOD_NCCL_HOME=$toolkit HOROVOD_NCCL_LINK=SHARED
  # Pascal to Hopper: what TF 2.21's own CUDA kernels cover (sm_60 ... compute_90).
  export HOROVOD_BUILD_CUDA_CC_LIST=${HOROVOD_BUILD_CUDA_CC_LIST:-60,70,75,80,86,89,90}
}

build_wheel() {
  local version=$1 src
  src=$(mktemp -d)
  "${PIP[@]}" download --no-deps --no-binary :all: -d "$src" "horovod==$HOROVOD_VERSION"
  tar -xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src"
  for name in "${patches[@]}"; do
    echo "applying $name"
    patch -d "$src/horovod-$HOROVOD_VERSION" -p1 <"$ROOT/tools/horovod-patches/$name"
  done
  sed -i "s/^__version__ = .*/__version__ = '$version'/" "$src/horovod-$HOROVOD_VERSION/horovod/__init__.py"
  # Gloo always; MPI only where Open MPI is installed; no PyTorch or MXNet.
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
  export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  if with_mpi; then export HOROVOD_WITH_MPI=1; else export HOROVOD_WITHOUT_MPI=1; fi
  [ "$TF_FLAVOR" = cpu ] || gpu_build_env
  # Horovod's setup.py runs `cmake --build` without -j: one compiler at a time. make reads
  # its job count from MAKEFLAGS, so every core compiles. Set, not defaulted: under
  # `make setup` it holds the outer make's own flags and variables (" -- MPI=1"), no -j.
  export MAKEFLAGS=-j$(nproc)
  # Against the TensorFlow already installed: its headers and ABI are what the ops need.
  "${PIP[@]}" wheel --no-build-isolation --no-deps --no-cache-dir -w "$DIST" \
    "$src/horovod-$HOROVOD_VERSION"
  rm -rf "$src"
}

version=$(wheel_version)
case ${1:-} in
  version) echo "$version" ;;
  wheel)
    wheel=$(existing_wheel "$version")
    if [ -z "$wheel" ]; then
      build_wheel "$version" >&2
      wheel=$(existing_wheel "$version")
    fi
    echo "$wheel" ;;
  *) echo "usage: tools/build_horovod.sh version|wheel (VENV, TF, TF_FLAVOR from the environment)" >&2
     exit 2 ;;
esac
