#!/usr/bin/env bash
# Creates a venv and installs everything hvd_mnist needs, in the one order that
# works: TensorFlow first, then Horovod compiled against it, then a check that
# the build has TensorFlow and Gloo. Each step is skipped when already done, so
# a second run takes seconds. Why this order: BUILD_NOTES.md.
#
#   tools/setup.sh                          CPU host, TF 2.21 + Keras 3 in .venv
#   TF=2.15 VENV=.venv-tf2.15 tools/setup.sh  TF 2.15 (Keras 2); 2.16-2.19 add tf-keras
#   TF_FLAVOR=gpu VENV=.venv-gpu tools/setup.sh  tensorflow[and-cuda], Horovod with NCCL (any host)
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
  echo "setup: no pins for TF=$TF; supported: $(cd "$ROOT/tools/pins" && ls | grep -v -- - | sed 's/^tf//; s/\.txt$//' | tr '\n' ' ')" >&2
  exit 2
fi
# TF_FLAVOR=gpu: tools/pins/tf<TF>-gpu.txt pins the CUDA wheels and names the GPU patches.
flavour_pins=()
if [ "$TF_FLAVOR" = gpu ]; then
  [ -f "$ROOT/tools/pins/tf$TF-gpu.txt" ] || { echo "setup: no GPU pins for TF=$TF (tools/pins/tf$TF-gpu.txt)" >&2; exit 2; }
  # With the CUDA C++ headers that Horovod's kernels need and TensorFlow does not.
  flavour_pins=(-c "$ROOT/tools/pins/tf$TF-gpu.txt" nvidia-cuda-cccl-cu12)
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

# System packages, only when missing and only as root (apt_install, in tools/setup_python.sh;
# else the tests that need them skip and say why): the test bed of hosts (tools/hosts.sh) needs
# iproute2 and openssh-server; the fault tests make a directory immutable as root with
# chattr (e2fsprogs, not in Debian 13's minimal system); MPI=1 adds Open MPI, so Horovod is built with it,
# and Slurm with munge for the Slurm cluster on the test bed (tools/slurm/bed.sh).
apt_packages=()
command -v ip >/dev/null || apt_packages+=(iproute2)
[ -x /usr/sbin/sshd ] || apt_packages+=(openssh-server)
command -v chattr >/dev/null || apt_packages+=(e2fsprogs)
if [ "${MPI:-0}" = 1 ] && ! command -v mpirun >/dev/null; then
  apt_packages+=(openmpi-bin libopenmpi-dev)
fi
if [ "${MPI:-0}" = 1 ] && ! { command -v slurmd >/dev/null && command -v munged >/dev/null; }; then
  apt_packages+=(slurm-wlm munge)
fi
# Not fatal: without these packages only the tests that need them skip, saying why.
apt_install optional "${apt_packages[@]}"

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
    -c "$PINS" "${flavour_pins[@]}"
  touch "$VENV/.deps-installed"
fi

# Keras 2 for TF >= 2.16. Without its dependencies: tf-keras requires
# `tensorflow`, which would install the full TensorFlow over tensorflow-cpu.
tf_keras_version=$(pinned tf-keras)
if [ -n "$tf_keras_version" ] && [ "$(installed_version tf-keras)" != "$tf_keras_version" ]; then
  step "install tf-keras $tf_keras_version" "${PIP[@]}" install --no-deps "tf-keras==$tf_keras_version"
fi

# Horovod's extension is compiled against one TensorFlow's headers and ABI, so it is
# built after TensorFlow, as a wheel in dist/ whose version names the TensorFlow, the
# flavour, MPI and the patches (tools/build_horovod.sh); a matching wheel already in
# dist/ is installed without compiling. Rebuilt when any of those changes, so also with
# MPI=1 after a build without MPI.
export VENV TF TF_FLAVOR
horovod_version=$("$ROOT/tools/build_horovod.sh" version)
if [ "$(installed_version horovod)" != "$horovod_version" ]; then
  step "build horovod wheel" "$ROOT/tools/build_horovod.sh" wheel
  horovod_wheel=$(tail -n 1 "$LOG_DIR/build_horovod_wheel.log")
  step "install horovod wheel" "${PIP[@]}" install "$horovod_wheel"
fi

check_build() {
  local report
  report=$("$VENV/bin/horovodrun" --check-build) || return 1
  echo "$report"
  # The line for a framework or controller reads "[X] TensorFlow" when built in.
  grep -q '\[X\] TensorFlow' <<<"$report" || { echo "horovod was built without TensorFlow"; return 1; }
  grep -q '\[X\] Gloo' <<<"$report" || { echo "horovod was built without Gloo"; return 1; }
  [ "$TF_FLAVOR" = cpu ] || grep -q '\[X\] NCCL' <<<"$report" ||
    { echo "horovod was built without NCCL"; return 1; }
}
step "horovodrun --check-build" check_build
