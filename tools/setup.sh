#!/usr/bin/env bash
# Creates a venv and installs everything hvd_mnist needs, in the one order that
# works: TensorFlow first, then Horovod compiled against it, then a check that
# the build has TensorFlow and Gloo. Each step is skipped when already done, so
# a second run takes seconds. Why this order: BUILD_NOTES.md.
#
#   tools/setup.sh                          CPU host, TF 2.21 + Keras 3 in .venv
#   TF=2.15 VENV=.venv-tf2.15 tools/setup.sh  TF 2.15 (Keras 2); 2.16-2.19 add tf-keras
#   TF_FLAVOR=gpu tools/setup.sh            GPU host: tensorflow[and-cuda]
#   MPI=1 tools/setup.sh                    also Open MPI (Debian packages, as root), Horovod built with it,
#                                           and Slurm and munge for the test bed's cluster
#
# tools/pins/tf<TF>.txt pins what differs between TensorFlow versions.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=${VENV:-$ROOT/.venv}
PYTHON=${PYTHON:-}
TF_FLAVOR=${TF_FLAVOR:-cpu}
TF=${TF:-2.21}
PINS=$ROOT/tools/pins/tf$TF.txt
HOROVOD_VERSION=0.28.1
LOG_DIR=$VENV/setup-logs

# Runs one named step with its output in a log; on failure prints the step's
# name and the end of its log instead of a wall of pip output.
step() {
  local name=$1; shift
  local log="$LOG_DIR/${name// /_}.log"
  local start=$SECONDS
  printf 'setup: %-28s ' "$name"
  if "$@" >"$log" 2>&1; then
    echo "ok ($((SECONDS - start)) s)"
  else
    echo "FAILED"
    echo "setup: step '$name' failed; last lines of $log:" >&2
    tail -n 25 "$log" >&2
    exit 1
  fi
}

case $TF_FLAVOR in
  cpu) tf_dist=tensorflow-cpu tf_spec=tensorflow-cpu ;;
  gpu) tf_dist=tensorflow tf_spec="tensorflow[and-cuda]" ;;
  *) echo "setup: TF_FLAVOR must be cpu or gpu, not '$TF_FLAVOR'" >&2; exit 2 ;;
esac
if [ ! -f "$PINS" ]; then
  echo "setup: no pins for TF=$TF; supported: $(cd "$ROOT/tools/pins" && ls | sed 's/^tf//; s/\.txt$//' | tr '\n' ' ')" >&2
  exit 2
fi
pinned() {  # the version tools/pins/tf<TF>.txt gives a distribution, or nothing
  sed -n "s/^$1==//p" "$PINS"
}
TF_VERSION=$(pinned $tf_dist)

# The Python (PYTHON=, else the pins' preference order on PATH or in pyenv), the
# system packages the build needs, and the venv: tools/setup_python.sh.
source "$ROOT/tools/setup_python.sh"
choose_python
ensure_build_packages

# System packages, only when missing and only as root (else the tests that
# need them skip and say why): the test bed of hosts (tools/hosts.sh) needs
# iproute2 and openssh-server; MPI=1 adds Open MPI, so Horovod is built with it,
# and Slurm with munge for the Slurm cluster on the test bed (tools/slurm/bed.sh).
apt_packages=()
command -v ip >/dev/null || apt_packages+=(iproute2)
[ -x /usr/sbin/sshd ] || apt_packages+=(openssh-server)
if [ "${MPI:-0}" = 1 ] && ! command -v mpirun >/dev/null; then
  apt_packages+=(openmpi-bin libopenmpi-dev)
fi
if [ "${MPI:-0}" = 1 ] && ! { command -v slurmd >/dev/null && command -v munged >/dev/null; }; then
  apt_packages+=(slurm-wlm munge)
fi
install_apt_packages() {
  # The test bed starts its own sshd, munged and Slurm daemons inside namespaces;
  # the packages' own services must not start in the root namespace.
  local policy=/usr/sbin/policy-rc.d made_policy=0
  if [ ! -e $policy ]; then printf '#!/bin/sh\nexit 101\n' >$policy; chmod +x $policy; made_policy=1; fi
  { [ "${APT_UPDATED:-0}" = 1 ] || apt-get update; } && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"
  local rc=$?
  [ $made_policy = 0 ] || rm -f $policy
  return $rc
}
if [ ${#apt_packages[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    mkdir -p "$LOG_DIR"
    # Not fatal: without these packages only the tests that need them skip, saying why.
    printf 'setup: %-28s ' "apt-get ${apt_packages[*]}"
    if install_apt_packages "${apt_packages[@]}" >"$LOG_DIR/apt-get.log" 2>&1; then
      echo ok
    else
      echo "FAILED (see $LOG_DIR/apt-get.log); the tests that need them will skip"
    fi
  else
    echo "setup: not installing ${apt_packages[*]} (needs root and apt-get); the tests that need them will skip"
  fi
fi

make_venv
mkdir -p "$LOG_DIR"
PY=$VENV/bin/python
PIP=("$PY" -m pip --disable-pip-version-check)

installed_version() {  # prints the installed version of a distribution, or nothing
  "$PY" - "$1" <<'EOF' 2>/dev/null || true
import sys
from importlib.metadata import version
print(version(sys.argv[1]))
EOF
}

if [ "$(installed_version wheel)" = "" ]; then
  step "upgrade pip and wheel" "${PIP[@]}" install --upgrade pip setuptools wheel
fi

# TensorFlow, TFDS, absl, pytest and the package itself (editable). setup.cfg
# holds the pins common to all versions, tools/pins/tf<TF>.txt TensorFlow's.
if [ "$(installed_version $tf_dist)" != "$TF_VERSION" ] \
   || [ "$(installed_version hvd_mnist)" = "" ] \
   || [ "$ROOT/setup.cfg" -nt "$VENV/.deps-installed" ] \
   || [ "$PINS" -nt "$VENV/.deps-installed" ]; then
  step "install TensorFlow $TF_VERSION and deps" "${PIP[@]}" install -e "$ROOT[test]" "$tf_spec" \
    -c "$PINS"
  touch "$VENV/.deps-installed"
fi

# Keras 2 for TF >= 2.16. Without its dependencies: tf-keras requires
# `tensorflow`, which would install the full TensorFlow over tensorflow-cpu.
tf_keras_version=$(pinned tf-keras)
if [ -n "$tf_keras_version" ] && [ "$(installed_version tf-keras)" != "$tf_keras_version" ]; then
  step "install tf-keras $tf_keras_version" "${PIP[@]}" install --no-deps "tf-keras==$tf_keras_version"
fi

# Horovod's extension is compiled against one TensorFlow's headers and ABI:
# rebuilt when the venv's TensorFlow is not the one it was built against, and
# with MPI=1 when it was built without MPI.
# Patches to Horovod's sdist that a TensorFlow version needs, named in its pins file
# by "# horovod-patch: NAME" lines (tools/horovod-patches/NAME; why: BUILD_NOTES.md).
horovod_patches=()
while read -r name; do horovod_patches+=("$name"); done < <(sed -n 's/^# horovod-patch: //p' "$PINS")
horovod_build="$tf_dist $TF_VERSION${horovod_patches[*]:+ patched: ${horovod_patches[*]}}"
# The patches' contents too: a patch changed under the same name builds Horovod again.
if [ ${#horovod_patches[@]} -gt 0 ]; then
  horovod_build+=" sha256 $(cd "$ROOT/tools/horovod-patches" && cat "${horovod_patches[@]}" \
                            | sha256sum | cut -c1-16)"
fi
build_patched_horovod() {
  local src
  src=$(mktemp -d)
  "${PIP[@]}" download --no-deps --no-binary :all: -d "$src" "horovod==$HOROVOD_VERSION" &&
    tar -xzf "$src/horovod-$HOROVOD_VERSION.tar.gz" -C "$src" || return 1
  for name in "${horovod_patches[@]}"; do
    echo "applying $name"
    patch -d "$src/horovod-$HOROVOD_VERSION" -p1 <"$ROOT/tools/horovod-patches/$name" || return 1
  done
  "${PIP[@]}" install --no-build-isolation --no-cache-dir "$src/horovod-$HOROVOD_VERSION" &&
    rm -rf "$src"
}
# The report is read whole first: with pipefail, `horovodrun ... | grep -q` fails whenever
# grep stops reading before horovodrun has written its last line.
has_mpi_build() {
  local report
  report=$("$VENV/bin/horovodrun" --check-build 2>/dev/null) && grep -q '\[X\] MPI' <<<"$report"
}
BUILT_AGAINST=$VENV/.horovod-built-against
if [ "$(installed_version horovod)" != "$HOROVOD_VERSION" ] \
   || [ "$(cat "$BUILT_AGAINST" 2>/dev/null)" != "$horovod_build" ] \
   || { [ "${MPI:-0}" = 1 ] && ! has_mpi_build; }; then
  # Gloo always; MPI only where OpenMPI is installed; no PyTorch or MXNet.
  export HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_GLOO=1
  export HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1
  if command -v mpirun >/dev/null && mpirun --version 2>/dev/null | grep -qi 'open mpi'; then
    export HOROVOD_WITH_MPI=1
  else
    export HOROVOD_WITHOUT_MPI=1
  fi
  if [ "$TF_FLAVOR" = gpu ]; then
    export HOROVOD_GPU_OPERATIONS=${HOROVOD_GPU_OPERATIONS:-NCCL}
  fi
  # Horovod's setup.py runs `cmake --build` without -j: one compiler at a time. make reads
  # its job count from MAKEFLAGS, so every core compiles. Set, not defaulted: under
  # `make setup` it holds the outer make's own flags and variables (" -- MPI=1"), no -j.
  export MAKEFLAGS=-j$(nproc)
  if [ -n "$(installed_version horovod)" ]; then
    step "uninstall the old horovod" "${PIP[@]}" uninstall -y horovod
  fi
  if [ ${#horovod_patches[@]} -eq 0 ]; then
    step "build horovod $HOROVOD_VERSION" "${PIP[@]}" install --no-build-isolation --no-cache-dir \
      "horovod==$HOROVOD_VERSION"
  else
    step "build patched horovod" build_patched_horovod
  fi
  echo "$horovod_build" >"$BUILT_AGAINST"
fi

check_build() {
  local report
  report=$("$VENV/bin/horovodrun" --check-build) || return 1
  echo "$report"
  # The line for a framework or controller reads "[X] TensorFlow" when built in.
  grep -q '\[X\] TensorFlow' <<<"$report" || { echo "horovod was built without TensorFlow"; return 1; }
  grep -q '\[X\] Gloo' <<<"$report" || { echo "horovod was built without Gloo"; return 1; }
}
step "horovodrun --check-build" check_build
